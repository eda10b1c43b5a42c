"""What the agent loop needs from a policy backend, and the per-episode state a backend keeps.

A backend (transformers, vLLM, an OpenAI-compatible HTTP server) implements :class:`Policy`:

* ``start`` encodes the first prompt (system prompt with the tool schemas, the user's media and
  question) into a :class:`Session`;
* ``generate`` continues a batch of sessions until a stop string, end of turn or the token limit;
* ``observe`` appends a tool's observation (text + images) as new prompt tokens.

The session holds the conversation as token ids, never as text: generated ids and encoded
observation ids are concatenated as they come (token-in/token-out), so the ids that training later
sees are exactly the ones the policy produced, and ``loss_mask`` marks which of them it produced.
Backends that only see text (``openai_http``, ``vllm_engine``) keep the conversation as messages or a
prompt string instead and leave the token-level fields empty: their trajectories are for evaluation,
not for training. The agent's context budget reads :attr:`Session.num_tokens`, which such backends
fill from the counts their engine reports.
"""

from __future__ import annotations

import abc
from dataclasses import dataclass, field
from typing import Any, Sequence

from PIL import Image

from mmagent.media import EpisodeMedia
from mmagent.toolbox.base import Observation


@dataclass
class SamplingConfig:
    """How the next token is picked. ``temperature == 0`` is greedy."""

    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = 0

    def __post_init__(self) -> None:
        if self.temperature < 0:
            raise ValueError("temperature must be >= 0")
        if not 0 < self.top_p <= 1:
            raise ValueError("top_p must be in (0, 1]")


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


#: pixels per visual token side for Qwen2.5-VL (14-pixel patches, 2x2 merge)
PATCH_FACTOR = 28


def fitted_size(width: int, height: int, min_pixels: int, max_pixels: int,
                factor: int = PATCH_FACTOR) -> tuple[int, int]:
    """(width, height) the model sees an image at: qwen-vl-utils' smart_resize within the pixel bounds."""
    from qwen_vl_utils import smart_resize

    h, w = smart_resize(height, width, factor=factor, min_pixels=min_pixels, max_pixels=max_pixels)
    return w, h


def fit_image(image: Image.Image, min_pixels: int, max_pixels: int, factor: int = PATCH_FACTOR) -> Image.Image:
    """``image`` resized as the policy is shown it (qwen-vl-utils ``fetch_image``: RGB, smart_resize, bicubic)."""
    from qwen_vl_utils import fetch_image

    return fetch_image({"image": image, "min_pixels": min_pixels, "max_pixels": max_pixels},
                       image_patch_size=factor // 2)


def visual_token_count(images: Sequence[Image.Image], min_pixels: int, max_pixels: int,
                       factor: int = PATCH_FACTOR) -> int:
    """Visual tokens these images cost once fitted: one per ``factor`` x ``factor`` pixels."""
    total = 0
    for im in images:
        w, h = fitted_size(im.width, im.height, min_pixels, max_pixels, factor)
        total += (h // factor) * (w // factor)
    return total


@dataclass
class Generation:
    """One turn of generated text and its tokens."""

    text: str
    token_ids: list[int]
    logprobs: list[float]
    #: the turn hit max_new_tokens before a stop string or end of turn
    truncated: bool
    #: tokens run through the model before this turn's first new token (the prompt the turn needed)
    prefill_tokens: int
    seconds: float = 0.0
    #: tokens generated; defaults to ``len(token_ids)`` (HTTP backends, which get no ids, give the count)
    num_tokens: int | None = None

    def __post_init__(self) -> None:
        if self.num_tokens is None:
            self.num_tokens = len(self.token_ids)


@dataclass
class Session:
    """One episode's conversation inside a policy. Backends subclass it to add their caches."""

    media: EpisodeMedia
    token_ids: list[int] = field(default_factory=list)
    loss_mask: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    prompt_length: int = 0
    visual_tokens: int = 0
    #: seconds of the frames shown in the first prompt
    initial_frame_times: list[float] = field(default_factory=list)
    seed: int = 0
    info: dict[str, Any] = field(default_factory=dict)

    @property
    def num_tokens(self) -> int:
        """Tokens in the conversation so far: what the context budget counts. Backends that hold the
        conversation as text (HTTP, vLLM) have no ids and override this with the count they know."""
        return len(self.token_ids)

    def _append(self, ids: Sequence[int], policy: bool, logprobs: Sequence[float] | None = None) -> None:
        self.token_ids.extend(int(i) for i in ids)
        self.loss_mask.extend([1 if policy else 0] * len(ids))
        self.logprobs.extend(logprobs if logprobs is not None else [0.0] * len(ids))


class TurnStream:
    """The turns being generated for a changing set of sessions (what :meth:`Policy.stream` returns).

    The agent adds (:meth:`add`) a session whenever it is ready for its next turn (its first prompt encoded, or
    its last observation appended) and calls :meth:`step` over and over; each call advances the sessions in
    flight and returns the turns that ended, which leave the stream at once. A backend that can let
    sessions join a running batch (the transformers one) overrides this; this default runs one
    ``policy.generate`` over everything added since the last step, so each step returns whole turns.
    """

    #: True when sessions added while others are mid-turn join them; False (lock-step) makes the agent
    #: gather every pending tool result before each step, so each batch is as large as it can be
    joins_running: bool = False

    def __init__(self, policy: "Policy", max_new_tokens: int) -> None:
        self.policy = policy
        self.max_new_tokens = max_new_tokens
        self.waiting: list[Session] = []

    def add(self, session: Session) -> None:
        self.waiting.append(session)

    def __len__(self) -> int:
        """Sessions in flight (added and not yet returned by :meth:`step`)."""
        return len(self.waiting)

    def sessions(self) -> list[Session]:
        return list(self.waiting)

    def step(self) -> list[tuple[Session, Generation]]:
        batch, self.waiting = self.waiting, []
        return list(zip(batch, self.policy.generate(batch, self.max_new_tokens))) if batch else []

    def close(self) -> None:
        """Release what the stream holds (called when the agent's run ends, also on errors)."""


class Policy(abc.ABC):
    """A vision-language model that can hold several episodes open at once."""

    media_budget: MediaBudget
    #: True when ``start`` may run in a worker thread while other sessions generate (it reads shared state
    #: only), so opening media overlaps with generation; the built-in backends set it
    thread_safe_start: bool = False

    @abc.abstractmethod
    def start(self, system_prompt: str, question: str, media: EpisodeMedia, seed: int = 0) -> Session:
        """Encode the first prompt of an episode."""

    @abc.abstractmethod
    def generate(self, sessions: Sequence[Session], max_new_tokens: int) -> list[Generation]:
        """Generate the next turn of each session (appended to it) until a stop string."""

    @abc.abstractmethod
    def observe(self, session: Session, observation: Observation) -> int:
        """Append ``observation`` as prompt tokens; return how many tokens it added."""

    @abc.abstractmethod
    def visual_tokens(self, images: Sequence[Image.Image]) -> int:
        """How many visual tokens these observation images would cost."""

    def end(self, session: Session) -> None:
        """Free what the session holds (caches). The token ids stay readable."""

    def stream(self, max_new_tokens: int) -> TurnStream:
        """A :class:`TurnStream` for one ``run_batch``; the default generates in lock-step batches."""
        return TurnStream(self, max_new_tokens)
