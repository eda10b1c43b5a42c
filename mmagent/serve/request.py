"""What ``mmagent serve`` accepts: the chat-completions request as a pydantic model, and the server's errors.

:func:`parse_request` turns a decoded JSON body into a :class:`ChatRequest` or raises :class:`RequestError`
with one readable sentence and the HTTP status it goes back with (400, or 404 for a model this server does
not serve). Fields are checked strictly (``"max_tokens": "5"`` or ``true`` is an error, not a coercion);
unknown OpenAI fields (``user``, ``presence_penalty``, ...) are accepted and ignored, as vLLM does.
Only what the server can honour is accepted: ``n`` is 1, media come as ``data:`` URLs (checked when the
messages are decoded), the last message is not an assistant turn.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from mmagent.policy.messages import MessageError, content_parts

#: new tokens when a request names no max_tokens
DEFAULT_MAX_TOKENS = 512


class RequestError(ValueError):
    """A request the server refuses: the message goes back to the client with ``status``."""

    def __init__(self, message: str, status: int = 400, kind: str = "invalid_request_error") -> None:
        super().__init__(message)
        self.status = status
        self.kind = kind


class ServerBusy(RequestError):
    """The request queue is full (or the server is stopping): HTTP 503 with a ``Retry-After`` in seconds."""

    def __init__(self, message: str, retry_after_s: int) -> None:
        super().__init__(message, 503, "server_busy")
        self.retry_after_s = retry_after_s


class ChatMessage(BaseModel):
    """One chat message: a role and content (a string, or a list of text / image_url / video_url parts)."""

    model_config = ConfigDict(extra="allow")

    role: Literal["system", "user", "assistant", "tool"]
    content: Any = None

    @field_validator("content")
    @classmethod
    def _parts(cls, value: Any) -> Any:
        try:
            content_parts(value, "the message")
        except MessageError as exc:
            raise ValueError(str(exc)) from None
        return value


class StreamOptions(BaseModel):
    model_config = ConfigDict(extra="allow", strict=True)

    #: send a last chunk with the token counts (``choices`` empty)
    include_usage: bool = False


class ChatRequest(BaseModel):
    """``POST /v1/chat/completions``: the fields this server reads."""

    model_config = ConfigDict(extra="allow", strict=True)

    model: str | None = None
    messages: list[ChatMessage] = Field(min_length=1)
    stream: bool = False
    stream_options: StreamOptions | None = None
    n: int | None = None
    stop: str | list[str] | None = None
    max_tokens: int | None = Field(None, ge=1)
    max_completion_tokens: int | None = Field(None, ge=1)
    seed: int | None = None
    temperature: float | None = Field(None, ge=0.0, le=2.0)
    top_p: float | None = Field(None, gt=0.0, le=1.0)
    #: vLLM's pass-through to the processor; ``fps`` (the video's frame rate) is read, the rest ignored
    mm_processor_kwargs: dict[str, Any] | None = None

    @field_validator("n")
    @classmethod
    def _one(cls, value: int | None) -> int | None:
        if value not in (None, 1):
            raise ValueError(f"only n=1 is supported, got {value}")
        return value

    @field_validator("stop")
    @classmethod
    def _stops(cls, value: str | list[str] | None) -> str | list[str] | None:
        stops = [value] if isinstance(value, str) else value or []
        if not all(stops):
            raise ValueError("stop strings must not be empty")
        return value

    @field_validator("mm_processor_kwargs")
    @classmethod
    def _fps(cls, value: dict[str, Any] | None) -> dict[str, Any] | None:
        fps = (value or {}).get("fps")
        if fps is not None and (not isinstance(fps, (int, float)) or isinstance(fps, bool) or fps <= 0):
            raise ValueError(f"fps must be a positive number, got {fps!r}")
        return value

    # ----- what the engine reads ------------------------------------------------------------------
    @property
    def stops(self) -> list[str]:
        return [self.stop] if isinstance(self.stop, str) else list(self.stop or [])

    @property
    def new_tokens(self) -> int:
        return self.max_completion_tokens or self.max_tokens or DEFAULT_MAX_TOKENS

    @property
    def fps(self) -> float | None:
        fps = (self.mm_processor_kwargs or {}).get("fps")
        return None if fps is None else float(fps)

    @property
    def include_usage(self) -> bool:
        return bool(self.stream_options and self.stream_options.include_usage)

    def message_dicts(self) -> list[dict[str, Any]]:
        """The messages as the client sent them (role, content and any other field)."""
        return [m.model_dump() for m in self.messages]


def _where(loc: tuple[Any, ...]) -> str:
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        elif part in ("str", "list[str]", "int", "float", "bool") or "[" in str(part) or "function-" in str(part):
            continue  # pydantic's name of a union member, not a field
        else:
            out += ("." if out else "") + str(part)
    return out or "the request"


def parse_request(body: Any, model_name: str) -> ChatRequest:
    """``body`` (decoded JSON) as a :class:`ChatRequest` for a server that serves ``model_name``."""
    if not isinstance(body, dict):
        raise RequestError("the request body must be a JSON object")
    try:
        req = ChatRequest.model_validate(body)
    except ValidationError as exc:
        first = exc.errors()[0]
        msg = str(first["msg"]).removeprefix("Value error, ")
        more = f" (and {exc.error_count() - 1} more)" if exc.error_count() > 1 else ""
        raise RequestError(f"{_where(tuple(first['loc']))}: {msg}{more}") from None
    if req.model not in (None, "", model_name):
        raise RequestError(f"model {req.model!r} is not served here; this server serves {model_name!r}", 404,
                           "model_not_found")
    if req.messages[-1].role == "assistant":
        raise RequestError("the last message must not be an assistant turn (continuing a reply is not supported)")
    return req
