"""``web_search``: look up text about places and facts, offline by default or on the live web when configured.

The model gives only a ``query`` (and how many results it wants, ``k``). Where the results come from is
fixed by whoever builds the tool, never by the model: a :class:`SearchBackend` picked by name with
:func:`make_backend` or passed in directly.

The backends (offline ``bm25`` by default, live ``ddgs`` and ``serper``) live in
:mod:`mmagent.toolbox.search_backends`; this module is the tool the model calls.

Network failures, a missing key or a missing optional package become :class:`ToolError`, which the
agent shows the model as an error observation. Queries and every piece of result text are cleaned and
length-bounded before the model reads them, and angle brackets in result text are replaced so that a
web page cannot write the tags of the tool-call grammar into the model's context. The tool fetches no
page: result URLs are only shown as text.
"""

from __future__ import annotations

from dataclasses import asdict
from typing import Any

from mmagent.toolbox.base import Observation, Tool, ToolContext, ToolError
from mmagent.toolbox.registry import register
from mmagent.toolbox.search_backends import (  # noqa: F401  (re-exported: the backends are configured through this tool)
    _BM25Index, _load_or_build, BM25Backend, DDGSBackend, DEFAULT_K, DEFAULT_SNIPPET_CHARS, MAX_K,
    MAX_QUERY_CHARS, MAX_RESPONSE_BYTES, MAX_TITLE_CHARS, MAX_URL_CHARS, SearchBackend, SearchResult,
    SerperBackend, available_backends, clean_text, default_cache_dir, make_backend)


@register
class WebSearch(Tool):
    name = "web_search"
    timeout_s = 30.0

    def __init__(self, backend: str | SearchBackend = "bm25", *, snippet_chars: int = DEFAULT_SNIPPET_CHARS,
                 **backend_kwargs: Any) -> None:
        """``backend`` is a name for :func:`make_backend` (``backend_kwargs`` go to it) or a backend object."""
        if isinstance(backend, str):
            backend = make_backend(backend, **backend_kwargs)
        elif backend_kwargs:
            raise TypeError("backend options are only accepted with a backend name")
        if not isinstance(backend, SearchBackend):
            raise TypeError(f"backend must be a SearchBackend or one of {available_backends()}, got {backend!r}")
        self.backend = backend
        self.snippet_chars = snippet_chars
        if getattr(backend, "timeout_s", None):
            self.timeout_s = float(backend.timeout_s) + 5.0  # the backend times out first, with a clear message
        self.description = (
            f"Search {backend.label} by keywords, e.g. 'Kyoto Japan' or 'capital of Peru'. Returns up to k "
            "numbered results, each with a title, a source URL and a text snippet.")
        self.parameters = {
            "type": "object",
            "properties": {
                "query": {"type": "string", "minLength": 1, "maxLength": MAX_QUERY_CHARS,
                          "description": f"search keywords (at most {MAX_QUERY_CHARS} characters)"},
                "k": {"type": "integer", "minimum": 1, "maximum": MAX_K,
                      "description": f"number of results, 1 to {MAX_K} (default {DEFAULT_K})"},
            },
            "required": ["query"],
        }

    def run(self, arguments: dict[str, Any], context: ToolContext) -> Observation:
        query = clean_text(arguments["query"], MAX_QUERY_CHARS)
        if not query:
            raise ToolError("query must contain some words")
        k = int(arguments.get("k", DEFAULT_K))
        raw = self.backend.search(query, k)
        results = []
        for r in raw[:k]:
            title = clean_text(r.title, MAX_TITLE_CHARS) or "(untitled)"
            results.append(SearchResult(title, clean_text(r.url, MAX_URL_CHARS),
                                        clean_text(r.snippet, self.snippet_chars)))
        source = clean_text(self.backend.label, 100)
        data = {"backend": self.backend.name, "query": query, "results": [asdict(r) for r in results]}
        if not results:
            return Observation(text=f'No results for "{query}" in {source}. Try other keywords.', data=data)
        lines = [f'{len(results)} result{"s" if len(results) != 1 else ""} for "{query}" from {source}:']
        for n, r in enumerate(results, start=1):
            lines.append(f"{n}. {r.title}" + (f" [{r.url}]" if r.url else ""))
            if r.snippet:
                lines.append(f"   {r.snippet}")
        return Observation(text="\n".join(lines), data=data)
