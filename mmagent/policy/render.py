"""What the model sees: the one place where an episode's prompt and observations become model input.

The agent renders every step of an episode here and hands the result, a :class:`View`, to its policy:

* the first prompt (:meth:`Renderer.prompt`): the system prompt with the tool schemas, then a user turn with
  the video's first-look frames, the image, and the question, in that order;
* each observation (:meth:`Renderer.observation`): a user turn ``<tool_response>``, the tool's text, one
  ``"{handle} ({label}): <image>"`` line per returned image, ``</tool_response>``.

A view holds the messages with every image and frame already *fitted* (qwen-vl-utils' ``smart_resize``
within the :class:`MediaBudget`, bicubic), the size each handle was shown at (tools read boxes in those
pixels) and what the view costs in visual tokens. Backends only map it: the transformers and vLLM backends
take :meth:`View.text` (Qwen's ChatML, each image or video a vision placeholder) with :attr:`View.images`
and :attr:`View.videos`; the OpenAI-compatible client sends the messages as content parts
(:mod:`mmagent.policy.messages`); ``mmagent serve`` turns such a request back into a view with
:meth:`Renderer.fit`. So every backend shows the model the same conversation.

What differs between model families (the size of a visual token, the default system turn, how a frame's time
is written, the video metadata) is asked of the view's :class:`~mmagent.policy.families.Family`
(:mod:`mmagent.policy.families`: Qwen2.5-VL, Qwen3-VL); nothing here branches on a family. Both write
Qwen's ChatML with ``<|vision_start|>`` placeholders; observations are user turns wrapped in
``<tool_response>`` (Qwen2.5-VL's stock template drops images in ``tool``-role turns; Qwen3-VL's writes a tool
turn as exactly this user turn).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Sequence

import numpy as np
from PIL import Image

from mmagent.media import EpisodeMedia, VideoReader
from mmagent.protocol import RESPONSE_CLOSE, RESPONSE_OPEN
from mmagent.toolbox.base import Frame, Observation

from mmagent.policy.families import DEFAULT_FAMILY, Family
from mmagent.policy.families.base import IM_END, IM_START, IMAGE_PAD, VIDEO_PAD, VISION_END, VISION_START

__all__ = ["IM_END", "IM_START", "IMAGE_PAD", "VIDEO_PAD", "VISION_END", "VISION_START"]

#: the system turn Qwen2.5-VL's chat template writes when a conversation has none
DEFAULT_SYSTEM = DEFAULT_FAMILY.default_system
#: pixels per visual token side of the default family (Qwen2.5-VL: 14-pixel patches, 2x2 merge)
PATCH_FACTOR = DEFAULT_FAMILY.patch_factor
#: video frames per temporal patch: a video's visual tokens are ceil(frames / 2) * (h / 28) * (w / 28)
TEMPORAL_PATCH = 2


@dataclass
class MediaBudget:
    """How media become visual tokens (pixels per frame/image, frame count)."""

    #: frames sampled uniformly from the video for the first prompt
    video_frames: int = 16
    #: pixel bounds per video frame (Qwen2.5-VL: one token per 28x28 pixels, two frames per token slab)
    video_min_pixels: int = 28 * 28 * 4
    video_max_pixels: int = 224 * 224
    #: pixel bounds of the user's image
    image_min_pixels: int = 28 * 28 * 4
    image_max_pixels: int = 1024 * 28 * 28
    #: pixel bounds of each image a tool returns (frames, crops)
    observation_min_pixels: int = 28 * 28 * 4
    observation_max_pixels: int = 256 * 28 * 28

    def __post_init__(self) -> None:
        if self.video_frames < 1:
            raise ValueError("video_frames must be at least 1")
        for kind in ("video", "image", "observation"):
            lo, hi = getattr(self, f"{kind}_min_pixels"), getattr(self, f"{kind}_max_pixels")
            if not 0 < lo <= hi:
                raise ValueError(f"{kind}_min_pixels ({lo}) must be positive and at most {kind}_max_pixels ({hi})")

    def bounds(self, kind: str) -> tuple[int, int]:
        """(min, max) pixels of ``kind``: ``video`` (each frame), ``image`` (the user's) or ``observation``."""
        return getattr(self, f"{kind}_min_pixels"), getattr(self, f"{kind}_max_pixels")


#: the longest side a fitted image may have over its shortest (qwen-vl-utils and servers refuse more)
MAX_SHOWN_RATIO = 200
#: an image shown with its aspect ratio changed by more than this factor gets a note saying so
SQUEEZE_NOTE_FACTOR = 2.0


def fitted_size(width: int, height: int, min_pixels: int, max_pixels: int,
                factor: int = PATCH_FACTOR) -> tuple[int, int]:
    """(width, height) the model sees an image at: qwen-vl-utils' smart_resize within the pixel bounds, with
    every side at least ``factor`` pixels and at most ``MAX_SHOWN_RATIO`` times the other.

    smart_resize keeps the aspect ratio, so a very long, thin image (20000x200 within a small budget) would get
    a short side of 0 pixels; such an image is squeezed instead: its short side is one visual token and its
    long side what the budget allows (:func:`squeeze_note` says so to the model).
    """
    if width < 1 or height < 1:
        raise ValueError(f"an image of {width}x{height} pixels cannot be shown")
    from qwen_vl_utils import smart_resize

    long_side, short_side = max(width, height), min(width, height)
    if long_side / short_side <= MAX_SHOWN_RATIO:
        h, w = smart_resize(height, width, factor=factor, min_pixels=min_pixels, max_pixels=max_pixels)
        if min(w, h) >= factor and max(w, h) / min(w, h) <= MAX_SHOWN_RATIO:
            return w, h
    # Squeeze: one visual token across, as long as the budget, the ratio cap and the original allow.
    short = factor
    room = max(factor, max_pixels // short // factor * factor)
    natural = max(factor, round(long_side * short / short_side / factor) * factor)
    long = min(room, MAX_SHOWN_RATIO * factor, natural)
    return (long, short) if width >= height else (short, long)


def squeeze_note(source: tuple[int, int], shown: tuple[int, int]) -> str | None:
    """A note for the model when ``shown`` (width, height) changes the shape of ``source`` by more than
    ``SQUEEZE_NOTE_FACTOR`` (a very long, thin image fitted into the budget); None when it keeps it."""
    (sw, sh), (w, h) = source, shown
    source_shape, shown_shape = max(sw, sh) / min(sw, sh), max(w, h) / min(w, h)
    if max(source_shape / shown_shape, shown_shape / source_shape) <= SQUEEZE_NOTE_FACTOR:
        return None
    how = "squeezed" if shown_shape < source_shape else "stretched"
    return (f"(this {sw}x{sh} image is shown at {w}x{h}, {how} along its long side to fit, so its proportions "
            "are not the real ones)")


def fit_image(image: Image.Image, min_pixels: int, max_pixels: int, factor: int = PATCH_FACTOR) -> Image.Image:
    """``image`` resized as the policy is shown it: RGB, :func:`fitted_size`, bicubic (as qwen-vl-utils
    ``fetch_image`` does for any image smart_resize can fit)."""
    from qwen_vl_utils.vision_process import to_rgb  # RGBA on white, as fetch_image does

    w, h = fitted_size(image.width, image.height, min_pixels, max_pixels, factor)
    return to_rgb(image).resize((w, h), Image.BICUBIC)


@dataclass
class VideoClip:
    """A video as the model is shown it: frames fitted to one size, the time of each, the sampling rate."""

    frames: list[Image.Image]
    #: seconds from the video's start of each frame
    times: list[float]
    #: frames per second of this sampling (frames / duration): the time axis of Qwen2.5-VL's M-RoPE needs it
    fps: float

    @property
    def size(self) -> tuple[int, int]:
        return self.frames[0].size

    def padded(self) -> list[Image.Image]:
        """The frames repeated at the end to whole temporal patches, as qwen-vl-utils pads them."""
        return self.frames + [self.frames[-1]] * (-len(self.frames) % TEMPORAL_PATCH)

    def padded_times(self) -> list[float]:
        """The time of each padded frame (the last one repeated like its frame)."""
        return self.times + [self.times[-1]] * (-len(self.times) % TEMPORAL_PATCH)

    def array(self) -> np.ndarray:
        """The padded frames as a (T, H, W, 3) uint8 array (what the video processors take)."""
        return np.stack([np.asarray(f) for f in self.padded()])


@dataclass
class Part:
    """A piece of a message: text, or one image, or one video, as the model is shown it."""

    text: str = ""
    image: Image.Image | None = None
    video: VideoClip | None = None
    #: what tools call this image or video (``image``, ``obs:3``, ``video``); None for a request's media
    handle: str | None = None
    #: (width, height) of the image or frames before they were fitted
    source_size: tuple[int, int] | None = None

    @property
    def kind(self) -> str:
        return "video" if self.video is not None else "image" if self.image is not None else "text"


@dataclass
class Message:
    role: str  # system | user | assistant | tool (rendered as a user turn)
    parts: list[Part] = field(default_factory=list)

    @property
    def text(self) -> str:
        """The message's text parts, joined (its images and videos left out)."""
        return "".join(p.text for p in self.parts if p.kind == "text")


@dataclass
class View:
    """One step of an episode as the model sees it.

    ``continues=False``: the first prompt (the messages before the first assistant turn); ``True``: the turns
    that follow an assistant turn (a tool's observation), up to the next assistant turn.
    """

    messages: list[Message]
    continues: bool
    #: visual tokens of every image and video in the view
    visual_tokens: int = 0
    #: the tool observation shown (None for a first prompt or a request)
    observation: Observation | None = None
    #: the model family whose chat format :meth:`text` writes
    family: Family = DEFAULT_FAMILY
    #: notes the view adds for the model (an image shown squeezed), also in its text
    notes: list[str] = field(default_factory=list)

    @property
    def parts(self) -> list[Part]:
        return [p for m in self.messages for p in m.parts]

    @property
    def images(self) -> list[Image.Image]:
        """The fitted images, in the order their placeholders appear."""
        return [p.image for p in self.parts if p.image is not None]

    @property
    def videos(self) -> list[VideoClip]:
        return [p.video for p in self.parts if p.video is not None]

    @property
    def view_sizes(self) -> dict[str, tuple[int, int]]:
        """Handle -> the (width, height) it is shown at: what boxes the model writes about it refer to."""
        return {p.handle: (p.video.size if p.video is not None else p.image.size)
                for p in self.parts if p.handle is not None and p.kind != "text"}

    @property
    def frame_times(self) -> list[float]:
        """Seconds of the video frames shown (the first prompt's first look)."""
        return [t for v in self.videos for t in v.times]

    def text(self, close_turn: bool = True) -> str:
        """The view as Qwen's ChatML, each image or video one vision placeholder (the processor expands it).

        A first prompt is what the chat template writes for its messages plus the generation prompt. A
        continuation starts by closing the assistant turn before it (``close_turn``: unless the model already
        ended it with its end-of-turn token) and ends with the next assistant turn's header.
        """
        body = "".join(f"{IM_START}{'user' if m.role == 'tool' else m.role}\n{_placeholders(m.parts)}{IM_END}\n"
                       for m in self.messages)
        if self.continues:
            return (IM_END if close_turn else "") + "\n" + body + f"{IM_START}assistant\n"
        if (not self.messages or self.messages[0].role != "system") and self.family.default_system is not None:
            body = f"{IM_START}system\n{self.family.default_system}{IM_END}\n" + body
        return body + f"{IM_START}assistant\n"


def _placeholders(parts: Sequence[Part]) -> str:
    out = []
    for p in parts:
        if p.kind == "text":
            out.append(p.text)
        else:
            out.append(VISION_START + (VIDEO_PAD if p.kind == "video" else IMAGE_PAD) + VISION_END)
    return "".join(out)


def image_names(handles: Sequence[str], labels: Sequence[str], n: int) -> list[str]:
    """What each observation image is called in the text: ``"obs:3 (frame 12.50s)"``, or ``"image 1"``."""
    handles = list(handles) or [f"image {k + 1}" for k in range(n)]
    labels = list(labels) or [""] * n
    return [f"{h} ({lab})" if lab else h for h, lab in zip(handles, labels)]


class Renderer:
    """Renders views within a pixel budget for a model ``family`` (``factor``: pixels per visual token side,
    the family's unless given)."""

    def __init__(self, budget: MediaBudget | None = None, factor: int | None = None,
                 family: Family = DEFAULT_FAMILY) -> None:
        self.budget = budget or MediaBudget()
        self.family = family
        self.factor = factor or family.patch_factor

    # ----- sizes and costs ------------------------------------------------------------------------
    def fit(self, image: Image.Image, kind: str) -> Image.Image:
        """``image`` as shown for ``kind`` (``image``: the user's, ``observation``: a tool's, ``video``: a frame)."""
        return fit_image(image, *self.budget.bounds(kind), self.factor)

    def image_tokens(self, size: tuple[int, int]) -> int:
        """Visual tokens of an image shown at ``size``."""
        return (size[1] // self.factor) * (size[0] // self.factor)

    def video_tokens(self, clip: VideoClip) -> int:
        return math.ceil(len(clip.frames) / TEMPORAL_PATCH) * self.image_tokens(clip.size)

    def visual_tokens(self, images: Sequence[Image.Image], kind: str = "observation") -> int:
        """What ``images`` would cost shown as ``kind`` (the agent's visual budget asks before showing them)."""
        lo, hi = self.budget.bounds(kind)
        return sum(self.image_tokens(fitted_size(im.width, im.height, lo, hi, self.factor)) for im in images)

    def clip(self, frames: Sequence[Image.Image], times: Sequence[float], fps: float) -> VideoClip:
        """Frames fitted to one size within the per-frame budget (the first frame's), as the video processor
        takes them. qwen-vl-utils' ``fetch_video`` is not used for frame lists: it pre-resizes each frame with
        twice the patch factor, which rounds small frames to zero pixels (qwen-vl-utils 0.0.14)."""
        w, h = fitted_size(*frames[0].size, *self.budget.bounds("video"), self.factor)
        fitted = [f.convert("RGB").resize((w, h), Image.BICUBIC) for f in frames]
        return VideoClip(fitted, [float(t) for t in times], float(fps))

    def sample_video(self, video: VideoReader) -> list[Frame]:
        """The first look at a video: ``video_frames`` frames at the centres of equal slices."""
        return video.sample_uniform(self.budget.video_frames)

    def _view(self, messages: list[Message], continues: bool, observation: Observation | None = None,
              notes: Sequence[str] = ()) -> View:
        tokens = sum(self.video_tokens(p.video) if p.video is not None else self.image_tokens(p.image.size)
                     for m in messages for p in m.parts if p.kind != "text")
        return View(messages, continues, tokens, observation, self.family, list(notes))

    # ----- the steps of an episode ----------------------------------------------------------------
    def prompt(self, system_prompt: str, question: str, media: EpisodeMedia) -> View:
        """The first prompt: the system prompt, then the video's first look, the image and the question."""
        content: list[Part] = []
        video = media.video
        if video is not None:
            frames = self.sample_video(video)
            clip = self.clip([f.image for f in frames], [f.timestamp for f in frames], len(frames) / video.duration)
            content.append(Part(video=clip, handle="video", source_size=frames[0].image.size))
        notes = []
        if media.image is not None:
            shown = self.fit(media.image, "image")
            content.append(Part(image=shown, handle="image", source_size=media.image.size))
            if note := squeeze_note(media.image.size, shown.size):
                notes.append(note)
                content.append(Part(text=note.capitalize() + "\n"))
        content.append(Part(text=question))
        return self._view([Message("system", [Part(text=system_prompt)]), Message("user", content)], False,
                          notes=notes)

    def observation(self, observation: Observation) -> View:
        """A tool's observation as a user turn: ``<tool_response>``, its text, each image named, the close tag.
        A video frame (the tool says its times in ``data["timestamps"]``) is also preceded by its time as the
        family writes it (Qwen3-VL: ``<12.5 seconds>``; Qwen2.5-VL: nothing more than its name)."""
        images = observation.images
        names = image_names(observation.handles, observation.image_labels, len(images))
        handles = observation.handles or [None] * len(images)
        times = observation.data.get("timestamps") if isinstance(observation.data, dict) else None
        stamps = ([self.family.frame_time_text(float(t)) for t in times]
                  if isinstance(times, (list, tuple)) and len(times) == len(images) else [""] * len(images))
        parts: list[Part] = []
        notes = []
        text = RESPONSE_OPEN + "\n" + observation.text
        for image, name, handle, stamp in zip(images, names, handles, stamps):
            parts.append(Part(text=text + "\n" + name + ": " + stamp))
            shown = self.fit(image, "observation")
            parts.append(Part(image=shown, handle=handle, source_size=image.size))
            note = squeeze_note(image.size, shown.size)
            text = " " + note if note else ""
            notes += [note] if note else []
        parts.append(Part(text=text + "\n" + RESPONSE_CLOSE))
        return self._view([Message("user", parts)], True, observation, notes)

    def request(self, messages: Sequence[Message], continues: bool, keep_client_sized: bool = True) -> View:
        """A view of messages that arrive from a client (``mmagent serve``), their images and video frames
        decoded but maybe not fitted. Images in a first prompt get the image budget, later ones the
        observation budget. With ``keep_client_sized``, an image already sized by a client's renderer (sides
        multiples of the patch factor, at most four times this budget's pixels) is used as it came, so the
        client's pixel budget decides, as the in-process backend's would."""
        fitted = []
        for m in messages:
            parts = []
            for p in m.parts:
                if p.video is not None:
                    clip = p.video
                    if not (keep_client_sized and self._client_sized(clip.size, "video")):
                        clip = self.clip(clip.frames, clip.times, clip.fps)
                    parts.append(Part(video=clip, source_size=p.video.size))
                elif p.image is not None:
                    kind = "observation" if continues else "image"
                    kept = keep_client_sized and self._client_sized(p.image.size, kind)
                    parts.append(Part(image=p.image if kept else self.fit(p.image, kind), source_size=p.image.size))
                else:
                    parts.append(p)
            fitted.append(Message(m.role, parts))
        return self._view(fitted, continues)

    def _client_sized(self, size: tuple[int, int], kind: str) -> bool:
        w, h = size
        return w % self.factor == 0 and h % self.factor == 0 and w * h <= 4 * self.budget.bounds(kind)[1]
