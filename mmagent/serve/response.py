"""What ``mmagent serve`` answers: chat completions, streamed chunks and errors in OpenAI's JSON shapes.

A finished turn is a :class:`Completion`; :func:`completion_json` writes it as ``chat.completion``, and the
streaming path writes ``chat.completion.chunk`` events (:func:`chunk_json`): a first chunk with the role,
content deltas, a last chunk with ``finish_reason`` (and vLLM's ``stop_reason``), and, when the client asked
with ``stream_options.include_usage``, a chunk with ``usage`` and no choices. :class:`StreamedText` decides
how much of a turn still being generated may go out: never a caller's stop string, nor the start of one.
"""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass
from typing import Any, Sequence


@dataclass
class Completion:
    """One answered request: the reply and its token counts."""

    content: str
    #: "stop" (a stop string or end of turn) or "length" (max_tokens)
    finish_reason: str
    #: the caller's stop string that ended the reply (vLLM's field), None otherwise
    stop_reason: str | None
    prompt_tokens: int
    completion_tokens: int
    #: prompt tokens whose KV cache was already there (an earlier turn of the episode, a shared prefix)
    cached_tokens: int


def apply_stops(text: str, stops: Sequence[str]) -> tuple[str, str | None]:
    """Cut ``text`` at the first stop string (left out of the text, as OpenAI does); the one that matched."""
    best = None
    for s in stops:
        pos = text.find(s)
        if pos >= 0 and (best is None or pos < best[0]):
            best = (pos, s)
    if best is None:
        return text, None
    return text[:best[0]], best[1]


def new_id() -> str:
    return f"chatcmpl-{uuid.uuid4().hex}"


def usage_json(c: Completion) -> dict[str, Any]:
    return {"prompt_tokens": c.prompt_tokens, "completion_tokens": c.completion_tokens,
            "total_tokens": c.prompt_tokens + c.completion_tokens,
            "prompt_tokens_details": {"cached_tokens": c.cached_tokens}}


def completion_json(c: Completion, model: str, request_id: str | None = None) -> dict[str, Any]:
    """The ``chat.completion`` object for ``c``."""
    return {"id": request_id or new_id(), "object": "chat.completion", "created": int(time.time()), "model": model,
            "choices": [{"index": 0, "message": {"role": "assistant", "content": c.content}, "logprobs": None,
                         "finish_reason": c.finish_reason, "stop_reason": c.stop_reason}],
            "usage": usage_json(c)}


def chunk_json(request_id: str, model: str, created: int, delta: dict[str, Any] | None,
               finish_reason: str | None = None, stop_reason: str | None = None,
               usage: dict[str, Any] | None = None, include_usage: bool = False) -> dict[str, Any]:
    """One ``chat.completion.chunk``; ``delta=None`` is the usage chunk (no choices)."""
    out: dict[str, Any] = {"id": request_id, "object": "chat.completion.chunk", "created": created, "model": model,
                           "choices": []}
    if delta is not None:
        choice: dict[str, Any] = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish_reason}
        if finish_reason is not None:
            choice["stop_reason"] = stop_reason
        out["choices"].append(choice)
    if include_usage:
        out["usage"] = usage
    return out


def error_json(status: int, message: str, kind: str) -> dict[str, Any]:
    """OpenAI's error body."""
    return {"error": {"message": message, "type": kind, "code": status}}


def _start_of_stop(text: str, stops: Sequence[str]) -> int:
    """Length of the longest end of ``text`` that is the beginning of a stop string (it may become one)."""
    longest = 0
    for s in stops:
        for n in range(min(len(s) - 1, len(text)), longest, -1):
            if text.endswith(s[:n]):
                longest = n
                break
    return longest


class StreamedText:
    """The part of a growing turn that can be sent: text before any stop string, less an end that could
    still turn into one, less a character still being decoded (a multi-byte character split over tokens)."""

    def __init__(self, stops: Sequence[str]) -> None:
        self.stops = list(stops)
        self.sent = ""

    def _delta(self, safe: str) -> str:
        if not safe.startswith(self.sent):  # cannot happen with a byte-level tokenizer; never resend
            return ""
        delta, self.sent = safe[len(self.sent):], safe
        return delta

    def update(self, text: str) -> str:
        """The new text to send, given the turn's text so far."""
        content, stop = apply_stops(text, self.stops)
        if stop is None:
            content = content.rstrip("\ufffd")
            content = content[:len(content) - _start_of_stop(content, self.stops)]
        return self._delta(content)

    def final(self, content: str) -> str:
        """What is left to send of the finished reply ``content`` (already cut at its stop string)."""
        return self._delta(content)
