"""Copies of the media for the browser: images sized for the gallery, videos in a codec every browser plays.

What the agent reads never changes: these are display copies only. The gallery gets each image scaled down
to at most :data:`DISPLAY_MAX_SIDE` pixels on its longer side (a 20000x200 panorama would exceed WebP's
16383-pixel limit, which Gradio's gallery encodes to), never below one pixel on the other. A video whose
codec or container browsers cannot play (MPEG-4 Part 2 from OpenCV's ``mp4v``, AVI, ...) is re-encoded to
H.264 in MP4 (PyAV's libx264, no ffmpeg binary needed), scaled to at most :data:`VIDEO_MAX_SIDE` pixels.
"""

from __future__ import annotations

import hashlib
import io
import os
import uuid
from fractions import Fraction
from pathlib import Path

import av
from PIL import Image

#: longest side of a gallery image (browsers and WebP both take it)
DISPLAY_MAX_SIDE = 2048
#: longest side of a video's display copy
VIDEO_MAX_SIDE = 1280
#: codecs browsers play, by container (file suffix)
PLAYABLE = {".mp4": {"h264", "av1", "vp9"}, ".m4v": {"h264", "av1", "vp9"}, ".webm": {"vp8", "vp9", "av1"}}
#: pixel formats browsers decode
PLAYABLE_PIX_FMTS = {"yuv420p", "yuvj420p"}


def display_image(image: Image.Image, max_side: int = DISPLAY_MAX_SIDE) -> Image.Image:
    """``image`` scaled down (aspect kept, each side at least 1 pixel) so its longer side is at most
    ``max_side``; the image itself when it already fits."""
    w, h = image.size
    if max(w, h) <= max_side:
        return image
    scale = max_side / max(w, h)
    return image.resize((max(1, round(w * scale)), max(1, round(h * scale))), Image.BILINEAR)


def gallery_file(image: Image.Image, folder: str | os.PathLike) -> str:
    """``image`` (already display-sized: :func:`display_image`) as a PNG in ``folder``, named by its content and
    written once, atomically; returns its path for the gallery.

    Why not hand Gradio the PIL image: on every update of a streamed gallery Gradio encodes each image again
    and rewrites the same cache file in place, so a browser still fetching it from the previous update can
    read a half-written file (seen: a broken image in the browser test under load, uvicorn's "Too little
    data for declared Content-Length"). A file path it copies into its cache once, under a temporary name."""
    buffer = io.BytesIO()
    image.save(buffer, format="PNG")
    data = buffer.getvalue()
    folder = Path(folder)
    path = folder / f"{hashlib.sha256(data).hexdigest()[:24]}.png"
    if not path.exists():
        folder.mkdir(parents=True, exist_ok=True)
        staging = folder / f".{path.name}.{uuid.uuid4().hex}"
        staging.write_bytes(data)
        os.replace(staging, path)
    return str(path)


def browser_playable(path: str | os.PathLike) -> bool:
    """Whether browsers play ``path`` as it is: an MP4 or WebM whose video codec and pixel format they decode.
    Anything PyAV cannot open counts as not playable."""
    p = Path(path)
    codecs = PLAYABLE.get(p.suffix.lower())
    if codecs is None:
        return False
    try:
        with av.open(str(p)) as container:
            if not container.streams.video:
                return False
            ctx = container.streams.video[0].codec_context
            return ctx.name in codecs and (ctx.pix_fmt or "yuv420p") in PLAYABLE_PIX_FMTS
    except (av.FFmpegError, OSError, ValueError):
        return False


def transcode_h264(src: str | os.PathLike, dst: str | os.PathLike, crf: int = 23, max_side: int | None = None,
                   preset: str = "veryfast") -> Path:
    """Re-encode the first video stream of ``src`` as H.264 (yuv420p, even sides, scaled down to ``max_side``
    when given) into the MP4 ``dst``; audio is left out. Raises ``av.FFmpegError`` for a file it cannot decode."""
    dst = Path(dst)
    with av.open(str(src)) as inp, av.open(str(dst), "w") as out:
        vin = inp.streams.video[0]
        rate = vin.average_rate or vin.guessed_rate or Fraction(25)
        w, h = vin.codec_context.width, vin.codec_context.height
        scale = min(1.0, max_side / max(w, h)) if max_side else 1.0
        vout = out.add_stream("libx264", rate=rate, options={"crf": str(crf), "preset": preset})
        vout.width, vout.height = max(2, int(w * scale) // 2 * 2), max(2, int(h * scale) // 2 * 2)
        vout.pix_fmt = "yuv420p"
        time_base = Fraction(1, 1) / rate  # one tick per frame
        vout.codec_context.time_base = time_base
        for index, frame in enumerate(inp.decode(vin)):
            frame = frame.reformat(width=vout.width, height=vout.height, format="yuv420p")
            frame.pts, frame.time_base = index, time_base
            for packet in vout.encode(frame):
                out.mux(packet)
        for packet in vout.encode():
            out.mux(packet)
    return dst


def playable_copy(path: str | os.PathLike, folder: str | os.PathLike, tag: str) -> Path:
    """An H.264 MP4 copy of ``path`` for the page's player, written in ``folder`` as ``<stem>.<tag>.mp4``."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    return transcode_h264(path, folder / f"{Path(path).stem}.{tag}.mp4", max_side=VIDEO_MAX_SIDE)
