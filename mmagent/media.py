"""Media I/O: open a video once per episode and decode frames at given times; load images; resolve handles.

Readers: decord (random access), PyAV (seek + decode) and OpenCV (seek by frame index). ``open_video``
tries them in order and says why each failed, so a file one library chokes on still opens with another.
Every reader answers in seconds: ``frames_at([12.5])`` returns the frame shown at 12.5 s together with
its own timestamp.

:class:`EpisodeMedia` is what tools see (it implements ``toolbox.ToolContext``): the episode's video
and image, the frames and observation images shown so far, addressed by handles — never by paths.
"""

from __future__ import annotations

import math
import os
import re
import threading
from concurrent.futures import ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from pathlib import Path
from typing import Callable, Sequence, TypeVar

import numpy as np
from PIL import Image, ImageOps

from mmagent.toolbox.base import Frame, ToolError

T = TypeVar("T")
#: draws on a decoded (H, W, 3) RGB frame in place, given its timestamp in seconds
Annotate = Callable[[np.ndarray, float], None]

#: images larger than this many pixels are refused (a decompression bomb guard)
MAX_IMAGE_PIXELS = 64_000_000
#: images and videos longer on one side than this many times the other are refused (qwen-vl-utils' limit)
MAX_ASPECT_RATIO = 200
BACKENDS = ("decord", "pyav", "opencv")


class MediaError(Exception):
    """A video or image that cannot be opened or decoded; the message says which file and why."""


def call_with_timeout(fn: Callable[[], T], timeout_s: float, what: str) -> T:
    """Run ``fn`` in a worker thread and give up after ``timeout_s`` seconds with a MediaError.

    Decoders can hang on damaged files; Python cannot kill the thread, but the caller gets control back.
    """
    pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="mmagent-media")
    future = pool.submit(fn)
    try:
        return future.result(timeout=timeout_s)
    except FutureTimeout:
        raise MediaError(f"{what} did not finish within {timeout_s:.0f}s") from None
    finally:
        pool.shutdown(wait=False)


class VideoReader:
    """Base of the readers: metadata plus ``frames_at`` in seconds. Thread-safe; keep one per video."""

    backend = ""

    def __init__(self, path: str | os.PathLike) -> None:
        self.path = str(path)
        self._lock = threading.Lock()
        self.fps: float = 0.0
        self.num_frames: int = 0
        self.width: int = 0
        self.height: int = 0

    @property
    def duration(self) -> float:
        return self.num_frames / self.fps

    def _check(self) -> None:
        if not (self.fps > 0 and math.isfinite(self.fps)) or self.num_frames <= 0:
            raise MediaError(f"{self.path}: no decodable frames (fps={self.fps}, frames={self.num_frames})")
        _check_aspect(self.width, self.height, self.path)

    def index_at(self, t: float) -> int:
        """Index of the frame on screen at time ``t`` seconds (clamped to the video; NaN is its start)."""
        x = t * self.fps + 1e-6
        if not math.isfinite(x):
            return self.num_frames - 1 if x > 0 else 0
        return int(min(max(math.floor(x), 0), self.num_frames - 1))

    def frames_at(self, timestamps: Sequence[float], annotate: Annotate | None = None) -> list[Frame]:
        """Frames shown at ``timestamps`` (seconds), in the order asked, each with its real timestamp.

        ``annotate(rgb_array, timestamp)``, if given, draws on each decoded frame in place before it
        becomes an image (one copy per frame instead of three).
        """
        if not timestamps:
            return []
        with self._lock:
            try:
                pairs = self._arrays_at([float(t) for t in timestamps])
            except MediaError:
                raise
            except Exception as exc:  # each library raises its own types, also after the file opened fine
                where = ", ".join(f"{float(t):.2f}s" for t in timestamps[:4]) + (", ..." if len(timestamps) > 4 else "")
                raise MediaError(f"{self.path}: {self.backend} could not decode the frames at {where} "
                                 f"({type(exc).__name__}: {str(exc)[:200]})") from None
        frames = []
        for arr, t in pairs:
            if annotate is not None:
                arr = np.ascontiguousarray(arr)
                annotate(arr, t)
            frames.append(Frame(Image.fromarray(arr), t))
        return frames

    def sample_uniform(self, n: int) -> list[Frame]:
        """``n`` frames at the centres of ``n`` equal slices of the whole video."""
        step = self.duration / n
        return self.frames_at([(i + 0.5) * step for i in range(n)])

    def _arrays_at(self, timestamps: list[float]) -> list[tuple[np.ndarray, float]]:
        """(H, W, 3) uint8 RGB arrays (writable) and the timestamps of the frames shown at ``timestamps``."""
        raise NotImplementedError

    def close(self) -> None:
        pass


class DecordReader(VideoReader):
    backend = "decord"

    def __init__(self, path: str | os.PathLike) -> None:
        super().__init__(path)
        import decord

        self._vr = decord.VideoReader(self.path, num_threads=1)
        self.num_frames = len(self._vr)
        self.fps = float(self._vr.get_avg_fps())
        h, w = self._vr[0].shape[:2] if self.num_frames else (0, 0)
        self.height, self.width = int(h), int(w)
        self._check()

    def _arrays_at(self, timestamps: list[float]) -> list[tuple[np.ndarray, float]]:
        idx = [self.index_at(t) for t in timestamps]
        batch = self._vr.get_batch(idx).asnumpy()
        return [(batch[k], i / self.fps) for k, i in enumerate(idx)]


class OpenCVReader(VideoReader):
    backend = "opencv"

    def __init__(self, path: str | os.PathLike) -> None:
        super().__init__(path)
        import cv2

        self._cv2 = cv2
        self._cap = cv2.VideoCapture(self.path)
        if not self._cap.isOpened():
            raise MediaError(f"{self.path}: OpenCV cannot open it")
        self.fps = float(self._cap.get(cv2.CAP_PROP_FPS) or 0.0)
        self.num_frames = int(self._cap.get(cv2.CAP_PROP_FRAME_COUNT) or 0)
        self.width = int(self._cap.get(cv2.CAP_PROP_FRAME_WIDTH))
        self.height = int(self._cap.get(cv2.CAP_PROP_FRAME_HEIGHT))
        self._next = 0  # index of the frame the next read() returns
        self._check()

    def _arrays_at(self, timestamps: list[float]) -> list[tuple[np.ndarray, float]]:
        cv2 = self._cv2
        out = []
        for t in timestamps:
            i = self.index_at(t)
            if i != self._next:
                self._cap.set(cv2.CAP_PROP_POS_FRAMES, i)
            ok, bgr = self._cap.read()
            if not ok:
                raise MediaError(f"{self.path}: OpenCV could not decode frame {i} ({t:.2f}s)")
            self._next = i + 1
            out.append((cv2.cvtColor(bgr, cv2.COLOR_BGR2RGB), i / self.fps))
        return out

    def close(self) -> None:
        self._cap.release()


class PyAVReader(VideoReader):
    backend = "pyav"

    def __init__(self, path: str | os.PathLike) -> None:
        super().__init__(path)
        import av

        self._container = av.open(self.path)
        if not self._container.streams.video:
            raise MediaError(f"{self.path}: no video stream")
        self._stream = self._container.streams.video[0]
        self._stream.thread_type = "AUTO"
        rate = self._stream.average_rate or self._stream.guessed_rate
        self.fps = float(rate) if rate else 0.0
        self.num_frames = int(self._stream.frames or 0)
        if self.num_frames <= 0 and self._stream.duration and self._stream.time_base:
            self.num_frames = int(round(float(self._stream.duration * self._stream.time_base) * self.fps))
        if self.num_frames <= 0 and self._container.duration:  # Matroska/WebM: only the container knows
            self.num_frames = int(round(self._container.duration / av.time_base * self.fps))
        self.width = int(self._stream.codec_context.width)
        self.height = int(self._stream.codec_context.height)
        #: quarter turns counter-clockwise that make the frames upright (the display matrix of phone videos)
        self._turns = self._quarter_turns()
        if self._turns % 2:
            self.width, self.height = self.height, self.width
        self._check()

    def _quarter_turns(self) -> int:
        try:  # _arrays_at seeks before it decodes, so reading ahead here costs nothing later
            frame = next(self._container.decode(self._stream))
        except Exception:  # no frame at all: _check or the first decode reports it
            return 0
        return round(float(getattr(frame, "rotation", 0) or 0) / 90) % 4

    def _arrays_at(self, timestamps: list[float]) -> list[tuple[np.ndarray, float]]:
        wanted = sorted(set(self.index_at(t) for t in timestamps))
        found: dict[int, np.ndarray] = {}
        half = 0.5 / self.fps
        pos = None  # index of the last decoded frame, when decoding sequentially
        decoder = None
        for i in wanted:
            target = i / self.fps
            # Seek unless the next wanted frame is a short sequential decode away.
            if decoder is None or pos is None or i <= pos or i - pos > self.fps * 2:
                self._container.seek(int(target / self._stream.time_base), stream=self._stream,
                                     backward=True, any_frame=False)
                decoder = self._container.decode(self._stream)
                pos = None
            last = None
            for frame in decoder:
                ft = float(frame.pts * self._stream.time_base) if frame.pts is not None else 0.0
                last = frame
                pos = int(round(ft * self.fps))
                if ft + half >= target:
                    break
            if last is None:
                raise MediaError(f"{self.path}: PyAV could not decode a frame at {target:.2f}s")
            arr = last.to_ndarray(format="rgb24")
            found[i] = np.ascontiguousarray(np.rot90(arr, self._turns)) if self._turns else arr
        out = []
        for t in timestamps:
            i = self.index_at(t)
            out.append((found[i].copy() if any(o is found[i] for o, _ in out) else found[i], i / self.fps))
        return out

    def close(self) -> None:
        self._container.close()


_READERS: dict[str, type[VideoReader]] = {"decord": DecordReader, "pyav": PyAVReader, "opencv": OpenCVReader}


def open_video(path: str | os.PathLike, backends: Sequence[str] = BACKENDS, timeout_s: float = 30.0) -> VideoReader:
    """Open ``path`` with the first backend that can read it; MediaError lists every backend's reason."""
    p = Path(path)
    if not p.is_file():
        raise MediaError(f"video not found: {p}")
    if p.stat().st_size == 0:
        raise MediaError(f"video file is empty: {p}")
    errors = []
    for name in backends:
        if name not in _READERS:
            raise ValueError(f"unknown video backend {name!r}; choose from {', '.join(_READERS)}")
        reader = None
        try:
            reader = call_with_timeout(lambda cls=_READERS[name]: cls(p), timeout_s, f"opening {p} with {name}")
            # A reader that opens but cannot decode its first frame is no use.
            call_with_timeout(lambda r=reader: r.frames_at([0.0]), timeout_s, f"decoding {p} with {name}")
            return reader
        except Exception as exc:  # each library raises its own types
            errors.append(f"{name}: {type(exc).__name__}: {exc}")
            if reader is not None:
                reader.close()
    raise MediaError(f"cannot read video {p}: " + "; ".join(errors))


def load_image(source: str | os.PathLike | Image.Image) -> Image.Image:
    """Load an image as upright 8-bit RGB; refuse empty, corrupt, oversized or needle-thin ones.

    Transparency (RGBA, LA, palette or colour-keyed) is composited on white, 16-bit and float greyscale
    is scaled to 8 bits, and the EXIF orientation of phone photos is applied.
    """
    if isinstance(source, Image.Image):
        return _to_rgb(source, "image")
    p = Path(source)
    if not p.is_file():
        raise MediaError(f"image not found: {p}")
    try:
        with Image.open(p) as im:
            if im.width * im.height > MAX_IMAGE_PIXELS:
                raise MediaError(f"{p}: {im.width}x{im.height} is over {MAX_IMAGE_PIXELS:,} pixels")
            im.load()
            return _to_rgb(im, p)
    except MediaError:
        raise
    except Exception as exc:
        raise MediaError(f"cannot read image {p}: {exc}") from None


def _to_rgb(image: Image.Image, name: object) -> Image.Image:
    if image.width * image.height > MAX_IMAGE_PIXELS:
        raise MediaError(f"image of {image.width}x{image.height} is over {MAX_IMAGE_PIXELS:,} pixels")
    _check_aspect(image.width, image.height, name)
    image = ImageOps.exif_transpose(image)  # phone photos are stored sideways and shown upright
    if image.mode in ("I", "F") or image.mode.startswith("I;16"):
        # 16-bit and float greyscale: scale to 8 bits (convert() would clip everything over 255 to white)
        arr = np.asarray(image, dtype=np.float64)
        top = float(arr.max()) if arr.size else 0.0
        peak = (65535.0 if image.mode.startswith("I;16") or (image.mode == "I" and top > 255)
                else 1.0 if image.mode == "F" and top <= 1.0 else 255.0)
        image = Image.fromarray(np.clip(np.rint(arr * (255.0 / peak)), 0, 255).astype(np.uint8), "L")
    if image.has_transparency_data:  # RGBA, LA, PA, and palette, grey or RGB images with a transparent colour
        rgba = image.convert("RGBA")
        image = Image.new("RGB", rgba.size, (255, 255, 255))
        image.paste(rgba, mask=rgba.split()[3])
    return image.convert("RGB")


def too_thin(width: int, height: int) -> bool:
    """More than ``MAX_ASPECT_RATIO`` times longer on one side than the other (the model cannot be shown it)."""
    return min(width, height) > 0 and max(width, height) / min(width, height) > MAX_ASPECT_RATIO


def _check_aspect(width: int, height: int, name: object) -> None:
    if too_thin(width, height):
        raise MediaError(f"{name}: {width}x{height} is more than {MAX_ASPECT_RATIO} times longer on one side "
                         "than the other, which the model cannot be shown")


_FRAME_HANDLE = re.compile(r"^frame@(-?\d+(?:\.\d+)?)s?$")
_OBS_HANDLE = re.compile(r"^obs:(\d+)$")


class EpisodeMedia:
    """The media of one episode, addressed by handles: ``video``, ``image``, ``frame@12.5``, ``obs:3``.

    Implements ``toolbox.ToolContext``. The video is opened lazily, once, and closed with the episode.
    """

    def __init__(self, video: str | os.PathLike | None = None, image: str | os.PathLike | Image.Image | None = None,
                 video_backends: Sequence[str] = BACKENDS, decode_timeout_s: float = 30.0) -> None:
        self.video_path = str(video) if video is not None else None
        self._video_backends = tuple(video_backends)
        self._decode_timeout_s = decode_timeout_s
        self._video: VideoReader | None = None
        self.image = load_image(image) if image is not None else None
        self.observation_images: list[Image.Image] = []
        self._view_sizes: dict[str, tuple[int, int]] = {}

    @property
    def video(self) -> VideoReader | None:
        if self.video_path is None:
            return None
        if self._video is None:
            self._video = open_video(self.video_path, self._video_backends, self._decode_timeout_s)
        return self._video

    def add_observation_images(self, images: Sequence[Image.Image]) -> list[str]:
        """Register images returned by a tool; return their handles ``obs:N`` (1-based, episode-wide)."""
        handles = []
        for im in images:
            self.observation_images.append(im)
            handles.append(f"obs:{len(self.observation_images)}")
        return handles

    def set_view_size(self, handle: str, size: tuple[int, int]) -> None:
        """Record the (width, height) at which the model was shown ``handle`` (the agent records each view's)."""
        self._view_sizes[handle] = (int(size[0]), int(size[1]))

    def view_size(self, handle: str) -> tuple[int, int]:
        key = "video" if _FRAME_HANDLE.match(handle.strip()) else handle.strip()
        if key in self._view_sizes:
            return self._view_sizes[key]
        im = self.resolve_image(handle)
        return im.width, im.height

    def resolve_image(self, handle: str) -> Image.Image:
        if not isinstance(handle, str):
            raise ToolError("an image handle must be a string such as 'image', 'frame@12.5' or 'obs:1'")
        handle = handle.strip()
        if handle == "image":
            if self.image is None:
                raise ToolError("this episode has no image; try 'frame@<seconds>' or 'obs:<n>'")
            return self.image
        if m := _OBS_HANDLE.match(handle):
            n = int(m.group(1))
            if not 1 <= n <= len(self.observation_images):
                raise ToolError(f"no image {handle}; tool images so far: obs:1 to obs:{len(self.observation_images)}"
                                if self.observation_images else f"no image {handle}; no tool has returned an image yet")
            return self.observation_images[n - 1]
        if m := _FRAME_HANDLE.match(handle):
            video = self.video
            if video is None:
                raise ToolError("this episode has no video, so there are no frames")
            t = float(m.group(1))
            if not 0 <= t <= video.duration:
                shown = f"{t:.2f}s" if abs(t) < 1e9 else f"{t:.3g}s"
                raise ToolError(f"frame time {shown} is outside the video (0.00s to {video.duration:.2f}s)")
            return video.frames_at([min(t, video.duration - 0.5 / video.fps)])[0].image
        raise ToolError(f"unknown image handle {handle!r}; use 'image', 'frame@<seconds>' or 'obs:<n>'")

    def close(self) -> None:
        if self._video is not None:
            self._video.close()
            self._video = None


def frames_to_array(frames: Sequence[Frame]) -> np.ndarray:
    """Stack frames into a (T, H, W, 3) uint8 array."""
    return np.stack([np.asarray(f.image.convert("RGB")) for f in frames])
