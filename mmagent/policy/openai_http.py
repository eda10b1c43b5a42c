"""A policy behind any OpenAI-compatible ``/v1/chat/completions`` endpoint (``vllm serve``, ``mmagent serve``, ...).

The session keeps the conversation as chat messages (:mod:`mmagent.policy.messages`): each view the agent
renders (:mod:`mmagent.policy.render`) becomes messages whose images are PNG data URLs and whose video is a
list of frames, fitted by the client's own :class:`~mmagent.policy.render.MediaBudget` exactly as the
transformers backend would show them; an observation is a user turn. Every turn sends the whole
conversation; a server with prefix caching (vLLM, ``mmagent serve``) only computes what is new.

Token-level fields stay empty: the server tokenizes, so the client never sees ids or a loss mask, and
these trajectories are for evaluation, not training. The agent's budgets still hold:

* context: :attr:`HTTPSession.num_tokens` is the server's own count from the last answer
  (``usage.prompt_tokens + usage.completion_tokens``) plus an estimate for what was added since (the
  view's visual tokens, counted by the renderer for Qwen-style 28-pixel patches, and its text at about
  three characters a token);
* visual tokens: the renderer's count, from the sizes the images are sent at (what the server will see).

What is sent for each model family (:attr:`OpenAIPolicy.family`, given or read from the served model's name):
the messages of the views rendered for that family, so a server applying the family's hub chat template writes
:meth:`View.text`. Qwen2.5-VL: the first prompt's video as a frame list plus ``mm_processor_kwargs={"fps": ...,
"do_resize": False}`` (the M-RoPE time axis); observation frames as images named with their times. Qwen3-VL:
the same parts and ``mm_processor_kwargs`` (its images and frames fitted to 32-pixel tokens), observation
frames each preceded by its time as ``<t seconds>`` text; the server writes the first-look video's
``<t seconds>`` itself from ``fps`` (frame ``k`` at ``k / fps``: the chat API carries no per-frame times, so
these are up to half a sampling interval earlier than the centres of the slices the frames were taken at).

Generation stops at the protocol's stop strings (``</tool_call>``, ``</answer>``). OpenAI-style servers
leave the matched stop string out of the text; it is put back (from vLLM's ``stop_reason`` when the
server sends one, else from the unclosed tag) so the agent's parser sees the turn as the model wrote it.

Failures are :class:`OpenAIBackendError` with one readable sentence: the server cannot be reached,
answered an HTTP error, or sent something that is not a chat completion. Connection failures, timeouts,
HTTP 408/409/429 and 5xx are retried (``retries`` times, with backoff, or after the ``Retry-After`` a busy
server sends) before giving up.
"""

from __future__ import annotations

import concurrent.futures as cf
import json
import math
import os
import socket
import time
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass, field
from typing import Any, Sequence

from mmagent.policy.base import Generation, Policy, Session, TurnStream
from mmagent.policy.messages import to_openai
from mmagent.policy.families import Family, family_for_name, get_family
from mmagent.policy.render import MediaBudget, View
from mmagent.policy.sampling import SamplingConfig
from mmagent.protocol import ANSWER_CLOSE, ANSWER_OPEN, CALL_CLOSE, CALL_OPEN, STOP_STRINGS
from mmagent.trajectory import Task

DEFAULT_BASE_URL = "http://127.0.0.1:8000/v1"
RETRY_STATUS = {408, 409, 429}
#: the longest wait a server's Retry-After header can ask for between two tries
MAX_RETRY_AFTER_S = 60.0


class OpenAIBackendError(RuntimeError):
    """The server could not be reached, answered an error, or sent something unreadable."""


@dataclass
class HTTPSession(Session):
    messages: list[dict[str, Any]] = field(default_factory=list)
    #: the server's count after the last turn plus estimates for what was appended since
    context_tokens: int = 0
    #: frames per second of the first prompt's video (sent as mm_processor_kwargs["fps"])
    fps: float | None = None

    @property
    def num_tokens(self) -> int:
        return self.context_tokens


def estimate_text_tokens(text: str) -> int:
    """A rough token count for text the server has not counted yet (about three characters a token)."""
    return max(1, math.ceil(len(text) / 3))


def normalise_base_url(url: str) -> str:
    """``http://host:port`` or ``http://host:port/v1`` -> ``http://host:port/v1`` (no trailing slash)."""
    parsed = urllib.parse.urlparse(url)
    if parsed.scheme not in ("http", "https") or not parsed.netloc:
        raise ValueError(f"--base-url must be an http(s) URL such as {DEFAULT_BASE_URL}, not {url!r}")
    path = parsed.path.rstrip("/")
    return urllib.parse.urlunparse(parsed._replace(path=path or "/v1")).rstrip("/")


class OpenAIPolicy(Policy):
    """A model served over HTTP with the OpenAI chat-completions API."""

    thread_safe_start = True

    def __init__(self, base_url: str = DEFAULT_BASE_URL, model: str | None = None, api_key: str | None = None,
                 media_budget: MediaBudget | None = None, temperature: float = 0.0, top_p: float = 1.0,
                 timeout_s: float = 600.0, retries: int = 3, backoff_s: float = 0.5, max_concurrency: int = 8,
                 extra_body: dict[str, Any] | None = None, patch_factor: int | None = None,
                 family: Family | str | None = None) -> None:
        self.base_url = normalise_base_url(base_url)
        self.model = model
        self.api_key = api_key
        self.media_budget = media_budget or MediaBudget()
        self.sampling = SamplingConfig(temperature, top_p)
        self.timeout_s = timeout_s
        self.retries = max(0, int(retries))
        self.backoff_s = backoff_s
        self.max_concurrency = max(1, int(max_concurrency))
        self.extra_body = dict(extra_body or {})
        self.patch_factor = patch_factor
        #: the served model's family (given, or read from its name; Qwen2.5-VL when the name says nothing)
        self._family_given = family is not None
        self.family = get_family(family) if isinstance(family, str) else family or family_for_name(model)

    # ----- HTTP -----------------------------------------------------------------------------------
    def _request(self, method: str, path: str, body: dict[str, Any] | None = None) -> dict[str, Any]:
        url = self.base_url + path
        data = json.dumps(body).encode() if body is not None else None
        headers = {"Content-Type": "application/json", "Accept": "application/json"}
        if self.api_key:
            headers["Authorization"] = f"Bearer {self.api_key}"
        last, retry_after = "", 0.0
        for attempt in range(self.retries + 1):
            if attempt:
                time.sleep(max(self.backoff_s * 2 ** (attempt - 1), retry_after))
            retry_after = 0.0
            req = urllib.request.Request(url, data=data, headers=headers, method=method)
            try:
                with urllib.request.urlopen(req, timeout=self.timeout_s) as resp:
                    raw = resp.read()
            except urllib.error.HTTPError as exc:
                detail = _error_detail(exc.read())
                last = f"{method} {url} answered HTTP {exc.code}: {detail}"
                if exc.code in RETRY_STATUS or exc.code >= 500:
                    retry_after = _retry_after_s(exc.headers.get("Retry-After"))
                    continue
                raise OpenAIBackendError(last) from None
            except (urllib.error.URLError, ConnectionError, socket.timeout, TimeoutError) as exc:
                reason = getattr(exc, "reason", exc)
                if isinstance(reason, ConnectionRefusedError):
                    last = (f"cannot connect to {self.base_url} (connection refused): is the server running? Start "
                            "one with `mmagent serve --model M` or `vllm serve M`, or fix --base-url")
                elif isinstance(reason, (socket.timeout, TimeoutError)):
                    last = f"no answer from {url} within {self.timeout_s:g} s"
                else:
                    last = f"cannot reach {url} ({type(reason).__name__}: {reason})"
                continue
            try:
                out = json.loads(raw)
            except (json.JSONDecodeError, UnicodeDecodeError):
                raise OpenAIBackendError(f"{method} {url} sent a response that is not JSON: "
                                         f"{raw[:200].decode('utf-8', 'replace')!r}") from None
            if not isinstance(out, dict):
                raise OpenAIBackendError(f"{method} {url} sent JSON that is not an object: {str(out)[:200]!r}")
            return out
        tries = f" (tried {self.retries + 1} times)" if self.retries else ""
        raise OpenAIBackendError(last + tries)

    def resolve_model(self) -> str:
        """The model name to send: the one given, else the first the server lists at ``/models``."""
        if self.model:
            return self.model
        listing = self._request("GET", "/models")
        try:
            self.model = str(listing["data"][0]["id"])
        except (KeyError, IndexError, TypeError):
            raise OpenAIBackendError(f"{self.base_url}/models lists no model; pass --model NAME") from None
        if not self._family_given:
            self.family = family_for_name(self.model)
        return self.model

    def _complete(self, session: HTTPSession, max_new_tokens: int) -> Generation:
        body: dict[str, Any] = {"model": self.resolve_model(), "messages": session.messages,
                                "max_tokens": int(max_new_tokens), "temperature": self.sampling.temperature,
                                "top_p": self.sampling.top_p, "seed": int(session.seed), "n": 1,
                                "stop": list(STOP_STRINGS)}
        if session.fps is not None:
            # vLLM passes these to the HF processor: the video's real frame rate (M-RoPE time positions), and
            # no resizing (the frames were sized here within the media budget).
            body["mm_processor_kwargs"] = {"fps": session.fps, "do_resize": False}
        body.update(self.extra_body)
        t0 = time.perf_counter()
        out = self._request("POST", "/chat/completions", body)
        try:
            choice = out["choices"][0]
            content = choice["message"]["content"]
            finish = choice.get("finish_reason")
            usage = out.get("usage") or {}
            if content is None:
                content = ""
            if not isinstance(content, str):
                raise TypeError(f"message content is {type(content).__name__}")
        except (KeyError, IndexError, TypeError) as exc:
            raise OpenAIBackendError(f"{self.base_url}/chat/completions sent a response that is not a chat "
                                     f"completion ({type(exc).__name__}: {exc}): {json.dumps(out)[:200]}") from None
        text = restore_stop(content, finish, choice.get("stop_reason"))
        completion = _int(usage.get("completion_tokens"), estimate_text_tokens(text))
        prompt = _int(usage.get("prompt_tokens"), session.context_tokens)
        cached = _int((usage.get("prompt_tokens_details") or {}).get("cached_tokens"), 0)
        session.context_tokens = prompt + completion
        session.messages.append({"role": "assistant", "content": text})
        return Generation(text=text, token_ids=[], logprobs=[], truncated=finish == "length",
                          prefill_tokens=max(0, prompt - cached), seconds=time.perf_counter() - t0,
                          num_tokens=completion)

    # ----- episode API ----------------------------------------------------------------------------
    def start(self, view: View, seed: int = 0, task: Task | None = None) -> HTTPSession:
        session = HTTPSession(seed=seed, task=task)
        session.messages = to_openai(view.messages)
        session.fps = next((clip.fps for clip in view.videos), None)
        session.context_tokens = view.visual_tokens + estimate_text_tokens("".join(m.text for m in view.messages))
        return session

    def stream(self, max_new_tokens: int) -> TurnStream:
        return _RequestStream(self, max_new_tokens)

    def generate(self, sessions: Sequence[HTTPSession], max_new_tokens: int) -> list[Generation]:
        if len(sessions) <= 1:
            return [self._complete(s, max_new_tokens) for s in sessions]
        # Concurrent requests: the server batches them (vLLM continuous batching).
        with cf.ThreadPoolExecutor(max_workers=min(len(sessions), self.max_concurrency)) as pool:
            futures = [pool.submit(self._complete, s, max_new_tokens) for s in sessions]
            return [fu.result() for fu in futures]

    def observe(self, session: HTTPSession, view: View) -> int:
        session.messages += to_openai(view.messages)
        text = view.observation.text if view.observation is not None else "".join(m.text for m in view.messages)
        added = view.visual_tokens + estimate_text_tokens(text) + 8 * (len(view.images) + 2)
        session.context_tokens += added
        return added

    def end(self, session: HTTPSession) -> None:
        session.messages = []  # the data URLs are the bulk of it


class _RequestStream(TurnStream):
    """Each session's request goes out the moment it is added (up to ``max_concurrency`` at once), so the
    server batches whatever is in flight while other episodes run their tools; :meth:`step` hands back
    the completions that have arrived."""

    joins_running = True

    def __init__(self, policy: OpenAIPolicy, max_new_tokens: int) -> None:
        super().__init__(policy, max_new_tokens)
        self.pool = cf.ThreadPoolExecutor(max_workers=policy.max_concurrency)
        self.in_flight: dict[cf.Future, HTTPSession] = {}

    def add(self, session: Session) -> None:
        self.in_flight[self.pool.submit(self.policy._complete, session, self.max_new_tokens)] = session

    def __len__(self) -> int:
        return len(self.in_flight)

    def sessions(self) -> list[Session]:
        return list(self.in_flight.values())

    def step(self) -> list[tuple[Session, Generation]]:
        # A short wait, so tool results that come in meanwhile are taken in without delay.
        done, _ = cf.wait(list(self.in_flight), timeout=0.05, return_when=cf.FIRST_COMPLETED)
        return [(self.in_flight.pop(f), f.result()) for f in done]

    def close(self) -> None:
        self.pool.shutdown(wait=False, cancel_futures=True)


def restore_stop(content: str, finish_reason: Any, stop_reason: Any = None) -> str:
    """Put back the stop string an OpenAI-style server left out of ``content``."""
    if finish_reason != "stop" or content.endswith(STOP_STRINGS):
        return content
    if isinstance(stop_reason, str):
        return content + stop_reason if stop_reason in STOP_STRINGS else content
    call, answer = content.rfind(CALL_OPEN), content.rfind(ANSWER_OPEN)
    if call > answer and CALL_CLOSE not in content[call:]:
        return content + CALL_CLOSE
    if answer > call and ANSWER_CLOSE not in content[answer:]:
        return content + ANSWER_CLOSE
    return content


def _int(value: Any, default: int) -> int:
    return int(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else default


def _retry_after_s(value: str | None) -> float:
    """A ``Retry-After`` header in seconds (a busy server's hint; dates and nonsense count as none), at most
    ``MAX_RETRY_AFTER_S``."""
    try:
        seconds = float(value) if value is not None else 0.0
    except ValueError:
        return 0.0
    return min(max(seconds, 0.0), MAX_RETRY_AFTER_S) if math.isfinite(seconds) else 0.0


def _error_detail(raw: bytes) -> str:
    """The message of an OpenAI-style error body, else the body's first 200 characters."""
    text = raw.decode("utf-8", "replace")
    try:
        err = json.loads(text).get("error")
        msg = err.get("message") if isinstance(err, dict) else err
        if isinstance(msg, str) and msg:
            return msg
    except (json.JSONDecodeError, AttributeError):
        pass
    text = " ".join(text.split())
    return (text[:200] + "...") if len(text) > 200 else (text or "(empty body)")


def api_key_from_env(var: str | None) -> str | None:
    """The API key in environment variable ``var`` (None: OPENAI_API_KEY if set). A named but unset
    variable is an error, so a typo does not silently send no key."""
    if var is None:
        return os.environ.get("OPENAI_API_KEY") or None
    if not os.environ.get(var):
        raise ValueError(f"environment variable {var} (from --api-key-env) is not set")
    return os.environ[var]
