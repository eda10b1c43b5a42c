"""Rendered views as OpenAI chat messages and back: the wire format of the HTTP client and ``mmagent serve``.

:func:`to_openai` maps the messages of a :class:`~mmagent.policy.render.View` to chat-completions messages:
text parts verbatim, each image a ``data:image/png;base64,...`` URL (lossless: the server sees the pixels the
client fitted), the video vLLM's frame-list form, ``data:video/jpeg;base64,<frame>,<frame>,...`` (vLLM splits
it on commas and opens each frame with PIL, which reads the PNG frames written here whatever the media type
says; its frame rate goes in ``mm_processor_kwargs["fps"]``). A system message of text only is sent as a
string. A server that applies Qwen's chat template to these messages writes exactly :meth:`View.text`.

:func:`from_openai` reads such messages back into renderer messages (images and frames decoded, not yet
fitted) for ``mmagent serve``, which renders them with :meth:`Renderer.request
<mmagent.policy.render.Renderer.request>`.
"""

from __future__ import annotations

import base64
import binascii
import io
from typing import Any, Sequence

from PIL import Image

from mmagent.policy.render import Message, Part, VideoClip

VIDEO_FRAMES_MIME = "video/jpeg"  # vLLM's name for a comma-separated list of base64 frames


class MessageError(ValueError):
    """A message or data URL that cannot be read."""


def image_to_base64(image: Image.Image) -> str:
    buf = io.BytesIO()
    image.convert("RGB").save(buf, format="PNG")
    return base64.b64encode(buf.getvalue()).decode("ascii")


def image_data_url(image: Image.Image) -> str:
    """``image`` as a lossless ``data:image/png;base64,...`` URL."""
    return "data:image/png;base64," + image_to_base64(image)


def video_data_url(frames: Sequence[Image.Image]) -> str:
    """Frames as vLLM's frame-list data URL (each frame a base64 PNG, comma-separated)."""
    return f"data:{VIDEO_FRAMES_MIME};base64," + ",".join(image_to_base64(f) for f in frames)


def _split_data_url(url: Any, what: str) -> tuple[str, str]:
    if not isinstance(url, str) or not url.startswith("data:"):
        shown = url[:60] + "..." if isinstance(url, str) and len(url) > 60 else url
        raise MessageError(f"{what} must be a data: URL (remote URLs are not fetched), got {shown!r}")
    head, sep, payload = url.partition(",")
    if not sep or not head.endswith(";base64"):
        raise MessageError(f"{what} must be a base64 data: URL (data:<type>;base64,<data>)")
    return head[len("data:"):-len(";base64")].lower(), payload


def _open_image(payload: str, what: str) -> Image.Image:
    try:
        raw = base64.b64decode(payload, validate=True)
        with Image.open(io.BytesIO(raw)) as im:
            return im.convert("RGB")
    except (binascii.Error, ValueError, OSError) as exc:
        raise MessageError(f"{what} is not a readable base64 image ({type(exc).__name__}: {exc})") from None


def decode_image_url(url: Any) -> Image.Image:
    """The image in a ``data:image/...;base64,`` URL."""
    mime, payload = _split_data_url(url, "an image_url")
    if not mime.startswith("image/"):
        raise MessageError(f"an image_url must hold an image, not {mime!r}")
    return _open_image(payload, "the image_url")


def decode_video_url(url: Any) -> list[Image.Image]:
    """The frames of a ``data:video/jpeg;base64,<f1>,<f2>,...`` URL (frames in any PIL format)."""
    mime, payload = _split_data_url(url, "a video_url")
    if mime != VIDEO_FRAMES_MIME:
        raise MessageError(f"a video_url must be a frame list (data:{VIDEO_FRAMES_MIME};base64,<frame>,<frame>,"
                           f"...), not {mime!r}")
    frames = [_open_image(p, f"frame {k + 1} of the video_url") for k, p in enumerate(payload.split(","))]
    if not frames:
        raise MessageError("the video_url holds no frames")
    return frames


def text_part(text: str) -> dict[str, Any]:
    return {"type": "text", "text": text}


def image_part(image: Image.Image) -> dict[str, Any]:
    return {"type": "image_url", "image_url": {"url": image_data_url(image)}}


def video_part(frames: Sequence[Image.Image]) -> dict[str, Any]:
    return {"type": "video_url", "video_url": {"url": video_data_url(frames)}}


def to_openai(messages: Sequence[Message]) -> list[dict[str, Any]]:
    """Renderer messages as chat-completions messages (see the module docstring)."""
    out = []
    for m in messages:
        if m.role == "system" and all(p.kind == "text" for p in m.parts):
            out.append({"role": "system", "content": m.text})
            continue
        parts = [video_part(p.video.frames) if p.video is not None else image_part(p.image) if p.image is not None
                 else text_part(p.text) for p in m.parts]
        out.append({"role": m.role, "content": parts})
    return out


def from_openai(messages: Sequence[dict[str, Any]], fps: float | None = None) -> list[Message]:
    """Chat-completions messages (checked by :func:`content_parts`) as renderer messages, their data URLs
    decoded; a video's frames get times at ``fps`` (default 2 frames a second, vLLM's default)."""
    out = []
    for k, msg in enumerate(messages):
        parts = []
        for p in content_parts(msg.get("content"), f"message {k}"):
            if p["type"] == "text":
                parts.append(Part(text=p["text"]))
            elif p["type"] == "image_url":
                parts.append(Part(image=decode_image_url(part_url(p))))
            else:
                frames = decode_video_url(part_url(p))
                if any(f.size != frames[0].size for f in frames):
                    raise MessageError("the frames of a video_url must all have the same size")
                rate = fps or 2.0
                parts.append(Part(video=VideoClip(frames, [i / rate for i in range(len(frames))], rate)))
        out.append(Message(msg["role"], parts))
    return out


def content_parts(content: Any, where: str = "a message") -> list[dict[str, Any]]:
    """A message's content as a list of parts (a string is one text part); checks their shape."""
    if isinstance(content, str):
        return [text_part(content)]
    if content is None:
        return []
    if not isinstance(content, list):
        raise MessageError(f"the content of {where} must be a string or a list of parts")
    for part in content:
        if not isinstance(part, dict) or part.get("type") not in ("text", "image_url", "video_url"):
            kind = part.get("type") if isinstance(part, dict) else type(part).__name__
            raise MessageError(f"{where} has a content part of type {kind!r}; expected text, image_url or video_url")
        if part["type"] == "text" and not isinstance(part.get("text"), str):
            raise MessageError(f"{where} has a text part without a \"text\" string")
    return content


def part_url(part: dict[str, Any]) -> Any:
    """The URL of an image_url / video_url part (``{"url": ...}`` or a bare string)."""
    value = part.get(part["type"])
    return value.get("url") if isinstance(value, dict) else value
