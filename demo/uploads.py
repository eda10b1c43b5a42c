"""Checks on what a demo user uploads: type, size, video length and image pixels, with plain messages.

Gradio itself refuses files over ``launch(max_file_size=...)`` before they reach us; these checks run
on every file the handler receives (uploads and examples alike) and open the file for real, so a
renamed or damaged file is refused up front instead of failing deep inside a tool. Every message is one
line that names the user's file (never the server's temporary path); the decoders' own reasons go to the
server's log.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from pathlib import Path

from PIL import Image

from mmagent.demo.errors import user_message
from mmagent.media import MAX_ASPECT_RATIO, MAX_IMAGE_PIXELS, MediaError, load_image, open_video, too_thin

log = logging.getLogger("mmagent.demo")

VIDEO_TYPES = (".mp4", ".avi", ".mov", ".mkv", ".webm", ".m4v")
IMAGE_TYPES = (".png", ".jpg", ".jpeg", ".webp", ".bmp")


class UploadError(ValueError):
    """An upload the demo refuses; the message is shown to the user as it is."""


@dataclass(frozen=True)
class UploadLimits:
    """What the demo accepts."""

    max_video_mb: float = 200.0
    max_image_mb: float = 20.0
    max_video_s: float = 600.0
    max_image_pixels: int = MAX_IMAGE_PIXELS

    def __post_init__(self) -> None:
        for name in ("max_video_mb", "max_image_mb", "max_video_s", "max_image_pixels"):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be positive")

    @property
    def max_file_mb(self) -> float:
        return max(self.max_video_mb, self.max_image_mb)


def _checked_file(path: str | os.PathLike, kind: str, types: tuple[str, ...], max_mb: float) -> Path:
    p = Path(path)
    name = p.name
    if p.suffix.lower() not in types:
        raise UploadError(f"{name}: not a supported {kind} type; use one of {', '.join(types)}")
    if not p.is_file():
        raise UploadError(f"{name}: the upload is missing (try uploading it again)")
    size_mb = p.stat().st_size / 2 ** 20
    if size_mb == 0:
        raise UploadError(f"{name}: the file is empty")
    if size_mb > max_mb:
        raise UploadError(f"{name}: {size_mb:.1f} MB is over the {max_mb:g} MB limit for a {kind}")
    return p


def check_video(path: str | os.PathLike, limits: UploadLimits) -> float:
    """The video's duration in seconds, or :class:`UploadError` saying what is wrong with it."""
    p = _checked_file(path, "video", VIDEO_TYPES, limits.max_video_mb)
    try:
        reader = open_video(p, timeout_s=30.0)
    except MediaError as exc:
        log.info("refused video %s: %s", p, exc)
        if "times longer on one side" in str(exc):
            raise UploadError(user_message(exc, [p])) from None
        raise UploadError(f"{p.name}: cannot be read as a video (no decoder could open it: the file is damaged, "
                          "not a video, or in a format none of them reads)") from None
    try:
        duration = float(reader.duration)
    finally:
        reader.close()
    if not duration > 0:
        raise UploadError(f"{p.name}: the video has no length")
    if duration > limits.max_video_s:
        raise UploadError(f"{p.name}: {duration:.0f} s is longer than the {limits.max_video_s:g} s limit")
    return duration


def check_image(path: str | os.PathLike, limits: UploadLimits) -> tuple[int, int]:
    """The image's (width, height), or :class:`UploadError` saying what is wrong with it."""
    p = _checked_file(path, "image", IMAGE_TYPES, limits.max_image_mb)
    try:
        with Image.open(p) as im:
            width, height = im.size
    except Exception as exc:  # PIL raises its own types for what it cannot identify
        log.info("refused image %s: %s", p, exc)
        raise UploadError(f"{p.name}: cannot be read as an image (the file is damaged or not an image)") from None
    if width * height > limits.max_image_pixels:
        raise UploadError(f"{p.name}: {width}x{height} is over the {limits.max_image_pixels:,} pixel limit")
    if too_thin(width, height):
        raise UploadError(f"{p.name}: {width}x{height} is more than {MAX_ASPECT_RATIO} times longer on one side "
                          "than the other, which the model cannot be shown (crop it first)")
    try:
        image = load_image(p)
    except MediaError as exc:
        log.info("refused image %s: %s", p, exc)
        raise UploadError(f"{p.name}: cannot be read as an image ({user_message(exc, [p])})") from None
    return image.size
