"""``mmagent serve``: an OpenAI-compatible chat-completions server over the transformers backend.

Endpoints: ``POST /v1/chat/completions`` (text, ``image_url`` and ``video_url`` parts as base64 data URLs;
remote URLs are refused, the server fetches nothing), ``GET /v1/models`` and ``GET /health``. Answers
follow the OpenAI schema (``choices[0].message.content``, ``finish_reason``, ``usage``) plus vLLM's
``stop_reason`` (the stop string that ended the turn) and ``usage.prompt_tokens_details.cached_tokens``.
Streaming and ``n > 1`` are refused with HTTP 400.

How a request becomes tokens (the same tokens ``HFPolicy`` builds in process): the messages are read back
into the renderer's messages (:func:`mmagent.policy.messages.from_openai`) and rendered
(:meth:`Renderer.request <mmagent.policy.render.Renderer.request>`): the messages before the first assistant
turn are the first prompt (``HFPolicy.start``); each assistant turn after that is its text, re-tokenized
(``HFPolicy.append_turn``), and the user turns that follow it are one observation view (``HFPolicy.observe``).
Only the policy's public API is used.

Sessions are kept: after a turn, the episode's :class:`~mmagent.policy.hf.HFSession` (its token ids and
KV cache) is stored under a hash of the conversation including the reply. When the next request
extends that conversation with the reply as sent, the session is picked up and only the new turns are
encoded and run through the model — so an episode over HTTP produces the very tokens (and, greedy,
the very answers) of the in-process backend, and prefills only what is new. A conversation the server
has not seen (another client, an edited reply, an evicted session) is encoded from its messages, the
assistant turns re-tokenized from their text. The newest ``max_sessions`` are kept.

Requests are served one at a time on the model (a lock): the transformers backend decodes sessions one
after another anyway. For throughput on a GPU use ``vllm serve``, which the same client talks to.
"""

from __future__ import annotations

import hashlib
import json
import sys
import threading
import time
import traceback
import uuid
from collections import OrderedDict
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Sequence

from mmagent.policy.messages import MessageError, content_parts, from_openai, part_url
from mmagent.policy.sampling import SamplingConfig

MAX_BODY_BYTES = 512 * 1024 * 1024
DEFAULT_MAX_TOKENS = 512


class RequestError(ValueError):
    """A request the server refuses: the message goes back to the client with ``status``."""

    def __init__(self, message: str, status: int = 400, kind: str = "invalid_request_error") -> None:
        super().__init__(message)
        self.status = status
        self.kind = kind


@dataclass
class _Prepared:
    session: Any
    hit: bool


class ChatEngine:
    """Turns chat-completion requests into HFPolicy calls; thread-safe (one request at a time)."""

    def __init__(self, policy: Any, model_name: str, max_sessions: int = 64) -> None:
        self.policy = policy
        self.model_name = model_name
        self.max_sessions = max(0, int(max_sessions))
        self.sessions: OrderedDict[str, Any] = OrderedDict()
        self.lock = threading.Lock()
        self.stats = {"requests": 0, "session_hits": 0, "session_misses": 0}

    # ----- keys -----------------------------------------------------------------------------------
    @staticmethod
    def _canonical(msg: dict[str, Any]) -> str:
        parts = []
        for p in content_parts(msg.get("content")):
            if p["type"] == "text":
                parts.append(["text", p["text"]])
            else:
                url = part_url(p)
                parts.append([p["type"], hashlib.sha256(str(url).encode()).hexdigest()])
        return json.dumps([msg.get("role"), parts], ensure_ascii=False)

    def _keys(self, messages: Sequence[dict[str, Any]], fps: Any) -> list[str]:
        """The running hash after each message (the conversation up to and including it)."""
        h = hashlib.sha256(json.dumps(["mmagent-serve", self.model_name, fps]).encode()).hexdigest()
        out = []
        for msg in messages:
            h = hashlib.sha256((h + self._canonical(msg)).encode()).hexdigest()
            out.append(h)
        return out

    def _store(self, key: str, session: Any) -> None:
        if self.max_sessions == 0:
            self.policy.end(session)
            return
        self.sessions[key] = session
        self.sessions.move_to_end(key)
        while len(self.sessions) > self.max_sessions:
            _, old = self.sessions.popitem(last=False)
            if old is not session:
                self.policy.end(old)

    # ----- encoding -------------------------------------------------------------------------------
    def _first_segment(self, messages: Sequence[dict[str, Any]], seed: int, fps: float | None) -> Any:
        """A new session from the messages before the first assistant turn (the first prompt)."""
        view = self.policy.renderer.request(from_openai(messages, fps), continues=False)
        return self.policy.start(view, seed=seed)

    def _append_assistant(self, session: Any, text: str) -> None:
        """An assistant turn the session has not generated: its text re-tokenized."""
        ids = self.policy.tokenizer.encode(text, add_special_tokens=False)
        if ids:
            self.policy.append_turn(session, ids)

    def _append_users(self, session: Any, messages: Sequence[dict[str, Any]]) -> None:
        """The turns after an assistant turn, as one observation view."""
        view = self.policy.renderer.request(from_openai(messages), continues=True)
        if view.videos:
            raise RequestError("a video_url is accepted only before the first assistant turn")
        self.policy.observe(session, view)

    def _prepare(self, messages: list[dict[str, Any]], seed: int, fps: float | None) -> tuple[Any, bool]:
        keys = self._keys(messages, fps)
        start, session = 0, None
        for k in range(len(messages) - 1, -1, -1):
            if messages[k]["role"] == "assistant" and keys[k] in self.sessions:
                session = self.sessions.pop(keys[k])
                start = k + 1
                break
        hit = session is not None
        if session is None:
            first = next((k for k, m in enumerate(messages) if m["role"] == "assistant"), len(messages))
            session = self._first_segment(messages[:first], seed, fps)
            start = first
        k = start
        while k < len(messages):
            if messages[k]["role"] == "assistant":
                self._append_assistant(session, "".join(p["text"] for p in content_parts(messages[k].get("content"))
                                                        if p["type"] == "text"))
                k += 1
                continue
            j = k
            while j < len(messages) and messages[j]["role"] != "assistant":
                j += 1
            self._append_users(session, messages[k:j])
            k = j
        return session, hit

    # ----- the endpoint ---------------------------------------------------------------------------
    def complete(self, body: Any) -> dict[str, Any]:
        req = _check_request(body, self.model_name)
        with self.lock:
            self.stats["requests"] += 1
            try:
                session, hit = self._prepare(req["messages"], req["seed"], req["fps"])
            except MessageError as exc:
                raise RequestError(str(exc)) from None
            self.stats["session_hits" if hit else "session_misses"] += 1
            policy = self.policy
            try:
                session.sampling = SamplingConfig(temperature=req["temperature"], top_p=req["top_p"])
            except ValueError as exc:
                raise RequestError(str(exc)) from None
            prompt_tokens = len(session.token_ids)
            gen = policy.generate([session], req["max_tokens"])[0]
            full = gen.text
            content, stop_reason = _apply_stops(full, req["stop"])
            finish = "stop" if stop_reason is not None or not gen.truncated else "length"
            if content + (stop_reason or "") == full:
                # Kept for the next turn under the reply with its stop string put back, as mmagent's client and
                # vLLM's include_stop_str_in_output send it; a reply sent back any other way is re-encoded.
                self._store(self._keys(req["messages"] + [{"role": "assistant", "content": full}], req["fps"])[-1],
                            session)
            else:  # generation ran past a caller's own stop string: the session holds more than the reply
                policy.end(session)
        return {
            "id": f"chatcmpl-{uuid.uuid4().hex}", "object": "chat.completion", "created": int(time.time()),
            "model": self.model_name,
            "choices": [{"index": 0, "message": {"role": "assistant", "content": content}, "logprobs": None,
                         "finish_reason": finish, "stop_reason": stop_reason}],
            "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": len(gen.token_ids),
                      "total_tokens": prompt_tokens + len(gen.token_ids),
                      "prompt_tokens_details": {"cached_tokens": max(0, prompt_tokens - gen.prefill_tokens)}},
        }


def _apply_stops(text: str, stops: Sequence[str]) -> tuple[str, str | None]:
    """Cut ``text`` at the first stop string (left out of the text, as OpenAI does); the one that matched."""
    best = None
    for s in stops:
        pos = text.find(s)
        if pos >= 0 and (best is None or pos < best[0]):
            best = (pos, s)
    if best is None:
        return text, None
    return text[:best[0]], best[1]


def _number(body: dict[str, Any], key: str, default: float, lo: float, hi: float) -> float:
    value = body.get(key, default)
    if value is None:
        return default
    if not isinstance(value, (int, float)) or isinstance(value, bool) or not lo <= value <= hi:
        raise RequestError(f"{key!r} must be a number in [{lo:g}, {hi:g}], got {value!r}")
    return float(value)


def _check_request(body: Any, model_name: str) -> dict[str, Any]:
    if not isinstance(body, dict):
        raise RequestError("the request body must be a JSON object")
    model = body.get("model")
    if model not in (None, "", model_name):
        raise RequestError(f"model {model!r} is not served here; this server serves {model_name!r}", 404,
                           "model_not_found")
    if body.get("stream"):
        raise RequestError("streaming is not supported by mmagent serve; send stream=false")
    if body.get("n", 1) not in (1, None):
        raise RequestError("only n=1 is supported")
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise RequestError("'messages' must be a non-empty list")
    for k, m in enumerate(messages):
        if not isinstance(m, dict) or m.get("role") not in ("system", "user", "assistant", "tool"):
            raise RequestError(f"message {k} must be an object with a role of system, user, assistant or tool")
        try:
            content_parts(m.get("content"), f"message {k}")
        except MessageError as exc:
            raise RequestError(str(exc)) from None
    if messages[-1]["role"] == "assistant":
        raise RequestError("the last message must not be an assistant turn (continuing a reply is not supported)")
    stop = body.get("stop") or []
    stop = [stop] if isinstance(stop, str) else stop
    if not isinstance(stop, list) or not all(isinstance(s, str) and s for s in stop):
        raise RequestError("'stop' must be a string or a list of non-empty strings")
    max_tokens = body.get("max_completion_tokens", body.get("max_tokens")) or DEFAULT_MAX_TOKENS
    if not isinstance(max_tokens, int) or isinstance(max_tokens, bool) or max_tokens < 1:
        raise RequestError(f"'max_tokens' must be a positive integer, got {max_tokens!r}")
    seed = body.get("seed") or 0
    if not isinstance(seed, int) or isinstance(seed, bool):
        raise RequestError(f"'seed' must be an integer, got {seed!r}")
    mm = body.get("mm_processor_kwargs") or {}
    fps = mm.get("fps") if isinstance(mm, dict) else None
    if fps is not None and (not isinstance(fps, (int, float)) or isinstance(fps, bool) or fps <= 0):
        raise RequestError(f"mm_processor_kwargs.fps must be a positive number, got {fps!r}")
    return {"messages": messages, "stop": stop, "max_tokens": max_tokens, "seed": seed, "fps": fps,
            "temperature": _number(body, "temperature", 1.0, 0.0, 2.0),
            "top_p": _number(body, "top_p", 1.0, 1e-9, 1.0)}


class _Handler(BaseHTTPRequestHandler):
    engine: ChatEngine
    verbose = False
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 (the stdlib's name)
        if self.verbose:
            sys.stderr.write("mmagent serve: %s - %s\n" % (self.address_string(), format % args))

    def _send(self, status: int, payload: dict[str, Any]) -> None:
        data = json.dumps(payload, ensure_ascii=False).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _error(self, status: int, message: str, kind: str) -> None:
        self._send(status, {"error": {"message": message, "type": kind, "code": status}})

    def do_GET(self) -> None:  # noqa: N802 (the stdlib's name)
        path = self.path.split("?")[0].rstrip("/")
        if path in ("/v1/models", "/models"):
            self._send(200, {"object": "list", "data": [{"id": self.engine.model_name, "object": "model",
                                                         "owned_by": "mmagent", "created": 0}]})
        elif path == "/health":
            self._send(200, {"status": "ok", **self.engine.stats})
        else:
            self._error(404, f"no endpoint {self.path}; try POST /v1/chat/completions", "not_found")

    def do_POST(self) -> None:  # noqa: N802
        path = self.path.split("?")[0].rstrip("/")
        if path not in ("/v1/chat/completions", "/chat/completions"):
            self._error(404, f"no endpoint {self.path}; try POST /v1/chat/completions", "not_found")
            return
        try:
            length = int(self.headers.get("Content-Length", ""))
        except ValueError:
            self._error(411, "send a Content-Length header", "invalid_request_error")
            return
        if length > MAX_BODY_BYTES:
            self._error(413, f"the request is over {MAX_BODY_BYTES // 2 ** 20} MiB", "invalid_request_error")
            return
        raw = self.rfile.read(length)
        try:
            body = json.loads(raw)
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            self._error(400, f"the request body is not JSON ({exc})", "invalid_request_error")
            return
        try:
            self._send(200, self.engine.complete(body))
        except RequestError as exc:
            self._error(exc.status, str(exc), exc.kind)
        except Exception as exc:  # a bug or a model failure: the client gets a 500, the log the traceback
            traceback.print_exc(file=sys.stderr)
            self._error(500, f"{type(exc).__name__}: {exc}", "server_error")


def make_server(engine: ChatEngine, host: str = "127.0.0.1", port: int = 8000, verbose: bool = False
                ) -> ThreadingHTTPServer:
    """A ready (bound, not yet serving) HTTP server; ``port=0`` picks a free port (``server.server_port``)."""
    handler = type("Handler", (_Handler,), {"engine": engine, "verbose": verbose})
    server = ThreadingHTTPServer((host, port), handler)
    server.daemon_threads = True
    return server


def load_engine(model: str, device: str | None = None, served_name: str | None = None, max_sessions: int = 64,
                media_budget: Any = None) -> ChatEngine:
    """Load ``model`` with the transformers backend (:mod:`mmagent.policy.loading`: its saved pixel budget,
    float32 on CPU)."""
    from mmagent.policy.loading import load_policy

    policy = load_policy(model, "hf", device=device, media_budget=media_budget)
    return ChatEngine(policy, served_name or model, max_sessions=max_sessions)
