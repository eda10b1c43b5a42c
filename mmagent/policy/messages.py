"""Conversations as chat messages: what the text-level backends (HTTP client, server, vLLM) share.

The transformers backend builds its token ids segment by segment; the backends that talk text must
produce *the same text*, or the model sees a different conversation. The rules, in one place:

* the first prompt is the model's chat template over ``[system, user]``, the user content being the
  video (if any), the image (if any), then the question, in that order (as ``HFPolicy.start``);
* an observation is a user turn whose text reproduces ``HFPolicy.observe`` exactly: ``<tool_response>``,
  the observation text, one ``"{handle} ({label}): <image>"`` line per image, ``</tool_response>``;
* later turns are ChatML, each image a ``<|vision_start|><|image_pad|><|vision_end|>`` placeholder.

Images travel as ``data:image/png;base64,...`` URLs (lossless: the server sees the pixels the client
fitted). A video travels as vLLM's frame-list form, ``data:video/jpeg;base64,<frame>,<frame>,...``:
vLLM splits it on commas and opens each frame with PIL, which reads the PNG frames written here
whatever the media type says; its frame rate goes in ``mm_processor_kwargs["fps"]``.
"""

from __future__ import annotations

import base64
import binascii
import io
from typing import Any, Sequence

from PIL import Image

from mmagent.protocol import RESPONSE_CLOSE, RESPONSE_OPEN

IM_START, IM_END = "<|im_start|>", "<|im_end|>"
VISION_START, VISION_END = "<|vision_start|>", "<|vision_end|>"
IMAGE_PAD, VIDEO_PAD = "<|image_pad|>", "<|video_pad|>"
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


def image_names(handles: Sequence[str], labels: Sequence[str], n: int) -> list[str]:
    """What each observation image is called in the text, as ``HFPolicy.observe`` writes it."""
    handles = list(handles) or [f"image {k + 1}" for k in range(n)]
    labels = list(labels) or [""] * n
    return [f"{h} ({lab})" if lab else h for h, lab in zip(handles, labels)]


def observation_parts(text: str, images: Sequence[dict[str, Any]], names: Sequence[str]) -> list[dict[str, Any]]:
    """Content parts of an observation turn; rendered by :func:`render_parts` they give exactly the text
    ``HFPolicy.observe`` builds: ``<tool_response>\\n{text}\\n{name}: <image>...\\n</tool_response>``."""
    parts: list[dict[str, Any]] = []
    buf = RESPONSE_OPEN + "\n" + text
    for part, name in zip(images, names):
        parts.append(text_part(buf + "\n" + name + ": "))
        parts.append(part)
        buf = ""
    parts.append(text_part(buf + "\n" + RESPONSE_CLOSE))
    return parts


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


def render_parts(parts: Sequence[dict[str, Any]]) -> str:
    """Content parts as prompt text: text verbatim, each image or video a vision placeholder."""
    out = []
    for part in parts:
        if part["type"] == "text":
            out.append(part["text"])
        elif part["type"] == "image_url":
            out.append(VISION_START + IMAGE_PAD + VISION_END)
        else:
            out.append(VISION_START + VIDEO_PAD + VISION_END)
    return "".join(out)


def render_chatml(messages: Sequence[dict[str, Any]], add_generation_prompt: bool = True) -> str:
    """Messages as Qwen's ChatML text (what Qwen2.5-VL's chat template writes for system/user/assistant)."""
    out = []
    if messages and messages[0].get("role") != "system":
        out.append(f"{IM_START}system\nYou are a helpful assistant.{IM_END}\n")
    for k, msg in enumerate(messages):
        out.append(f"{IM_START}{msg['role']}\n{render_parts(content_parts(msg.get('content'), f'message {k}'))}"
                   f"{IM_END}\n")
    if add_generation_prompt:
        out.append(f"{IM_START}assistant\n")
    return "".join(out)


def continuation(messages: Sequence[dict[str, Any]], close_turn: bool = True) -> str:
    """The text after an assistant turn for the messages that follow it (observations), up to the next
    ``<|im_start|>assistant\\n`` (``close_turn``: the assistant turn still needs its ``<|im_end|>``)."""
    body = "".join(f"{IM_START}{'user' if m['role'] == 'tool' else m['role']}\n"
                   f"{render_parts(content_parts(m.get('content'), 'a message'))}{IM_END}\n" for m in messages)
    return (IM_END if close_turn else "") + "\n" + body + f"{IM_START}assistant\n"
