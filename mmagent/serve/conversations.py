"""Chat messages into transformers-backend sessions, picking up the kept session of a conversation that goes on.

How a request becomes tokens (the same tokens ``HFPolicy`` builds in process): the messages are read back
into the renderer's messages (:func:`mmagent.policy.messages.from_openai`) and rendered
(:meth:`Renderer.request <mmagent.policy.render.Renderer.request>`): the messages before the first assistant
turn are the first prompt (``HFPolicy.start``); each assistant turn after that is its text, re-tokenized
(``HFPolicy.append_turn``), and the user turns that follow it are one observation view (``HFPolicy.observe``).
Only the policy's public API is used.

After a turn the episode's session (its token ids and KV cache) is kept (:class:`~mmagent.serve.store.
SessionStore`) under a hash of the conversation including the reply. When the next request extends that
conversation with the reply as sent, the session is picked up and only the new turns are encoded and run
through the model: an episode over HTTP produces the very tokens (and, greedy, the very answers) of the
in-process backend, and prefills only what is new. A conversation the server has not seen (another client,
an edited reply, an expired session) is encoded from its messages, the assistant turns re-tokenized.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any, Sequence

from mmagent.policy.messages import MessageError, content_parts, from_openai, part_url
from mmagent.serve.request import RequestError
from mmagent.serve.store import SessionStore


def _canonical(msg: dict[str, Any]) -> str:
    parts = []
    for p in content_parts(msg.get("content")):
        if p["type"] == "text":
            parts.append(["text", p["text"]])
        else:
            parts.append([p["type"], hashlib.sha256(str(part_url(p)).encode()).hexdigest()])
    return json.dumps([msg.get("role"), parts], ensure_ascii=False)


def _text(msg: dict[str, Any]) -> str:
    return "".join(p["text"] for p in content_parts(msg.get("content")) if p["type"] == "text")


class Conversations:
    """Sessions of ``policy`` (an ``HFPolicy``) for chat messages, kept between turns in ``store``."""

    def __init__(self, policy: Any, model_name: str, store: SessionStore) -> None:
        self.policy = policy
        self.model_name = model_name
        self.store = store

    def keys(self, messages: Sequence[dict[str, Any]], fps: float | None) -> list[str]:
        """The running hash after each message (the conversation up to and including it)."""
        h = hashlib.sha256(json.dumps(["mmagent-serve", self.model_name, fps]).encode()).hexdigest()
        out = []
        for msg in messages:
            h = hashlib.sha256((h + _canonical(msg)).encode()).hexdigest()
            out.append(h)
        return out

    def prepare(self, messages: list[dict[str, Any]], seed: int, fps: float | None) -> tuple[Any, bool]:
        """A session holding ``messages``, ready for the next assistant turn; whether a kept one was picked up.
        Raises :class:`RequestError` for messages that cannot be read."""
        try:
            return self._prepare(messages, seed, fps)
        except MessageError as exc:
            raise RequestError(str(exc)) from None

    def _prepare(self, messages: list[dict[str, Any]], seed: int, fps: float | None) -> tuple[Any, bool]:
        keys = self.keys(messages, fps)
        start, session = 0, None
        for k in range(len(messages) - 1, -1, -1):
            if messages[k]["role"] == "assistant" and keys[k] in self.store:
                session = self.store.pop(keys[k])
                if session is not None:
                    start = k + 1
                    break
        hit = session is not None
        try:
            if session is None:
                first = next((k for k, m in enumerate(messages) if m["role"] == "assistant"), len(messages))
                view = self.policy.renderer.request(from_openai(messages[:first], fps), continues=False)
                session = self.policy.start(view, seed=seed)
                start = first
            k = start
            while k < len(messages):
                if messages[k]["role"] == "assistant":
                    ids = self.policy.tokenizer.encode(_text(messages[k]), add_special_tokens=False)
                    if ids:
                        self.policy.append_turn(session, ids)
                    k += 1
                    continue
                j = k
                while j < len(messages) and messages[j]["role"] != "assistant":
                    j += 1
                view = self.policy.renderer.request(from_openai(messages[k:j]), continues=True)
                if view.videos:
                    raise RequestError("a video_url is accepted only before the first assistant turn")
                self.policy.observe(session, view)
                k = j
        except BaseException:
            if session is not None:
                self.policy.end(session)
            raise
        return session, hit

    def keep(self, messages: list[dict[str, Any]], reply: str, fps: float | None, session: Any) -> bool:
        """Keep ``session`` for the conversation ``messages`` + the assistant ``reply``; False if it was not
        kept (too big for the budget) and was ended."""
        compact = getattr(self.policy, "compact", None)
        if compact is not None:
            compact(session)
        key = self.keys(messages + [{"role": "assistant", "content": reply}], fps)[-1]
        return self.store.put(key, session)
