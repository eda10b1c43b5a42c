"""What differs between model families, as one small object per family (:class:`Family`).

Everything that is not the same for Qwen2.5-VL and Qwen3-VL lives in a family module under
:mod:`mmagent.policy.families` and nowhere else: the size of a visual token, the system turn the chat
template writes when a conversation has none, how a frame's time is written next to it, the video metadata
the processor is given, what the vLLM engine is sent for a video, the chat template and the tiny random
checkpoint the tests build. The renderer (:mod:`mmagent.policy.render`) and the backends ask the family;
they hold no ``if family == ...`` of their own.

Adding a family is one new module that defines a :class:`Family` subclass instance and registers it with
:func:`register` (see :mod:`mmagent.policy.families.qwen3_vl` for a complete one), plus its import in
``families/__init__.py``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

#: Qwen's ChatML and vision placeholders (shared by the Qwen-VL families)
IM_START, IM_END = "<|im_start|>", "<|im_end|>"
VISION_START, VISION_END = "<|vision_start|>", "<|vision_end|>"
IMAGE_PAD, VIDEO_PAD = "<|image_pad|>", "<|video_pad|>"


class UnsupportedModel(ValueError):
    """The checkpoint's ``model_type`` belongs to no family mmagent renders for."""


@dataclass(frozen=True)
class Family:
    """One model family: how its models are shown images, videos and conversations."""

    #: short name (``qwen2_5_vl``), what ``mmagent make-tiny --family`` takes
    name: str
    #: what people call it (``Qwen2.5-VL``)
    label: str
    #: the transformers ``config.model_type`` values of its checkpoints
    model_types: tuple[str, ...]
    #: a hub id of the family, for messages and examples
    example_id: str
    #: pixels per visual token side (patch size times spatial merge)
    patch_factor: int
    #: the system turn the chat template writes when a conversation has none (None: it writes none)
    default_system: str | None
    #: video frames per temporal patch (one slab of visual tokens)
    temporal_patch: int = 2
    #: lower-case pieces of a served model's name that mark the family (``qwen3-vl``), for clients that only
    #: know the name (the OpenAI-compatible one)
    name_hints: tuple[str, ...] = ()

    # ----- what the model sees ------------------------------------------------------------------
    def frame_time_text(self, seconds: float) -> str:
        """Text written right before a tool-returned video frame taken at ``seconds`` ("" for none)."""
        return ""

    def video_metadata(self, times: Sequence[float], fps: float) -> dict[str, Any]:
        """``VideoMetadata`` fields for a clip of (padded) frames at ``times`` sampled at ``fps``: what the
        processor derives the time axis from."""
        return {"fps": fps, "frames_indices": list(range(len(times)))}

    def vllm_video(self, frames: Any, times: Sequence[float], fps: float) -> tuple[Any, dict[str, Any]]:
        """What the vLLM engine is sent for a video: (the item in ``multi_modal_data["video"]``, the
        ``mm_processor_kwargs``)."""
        return frames, {"fps": fps}

    # ----- checkpoints --------------------------------------------------------------------------
    def chat_template(self) -> str:
        """A Jinja chat template that writes what the family's hub template writes for mmagent's messages."""
        raise NotImplementedError

    def build_processor(self, tokenizer: Any, min_pixels: int, max_pixels: int) -> Any:
        """The family's real processor (image + video processors) around ``tokenizer``."""
        raise NotImplementedError

    def tiny_config(self, tokenizer: Any, hidden_size: int, num_layers: int, vision_width: int,
                    vision_depth: int) -> Any:
        """A config a few hundred KB in size with the family's real architecture."""
        raise NotImplementedError

    def model_class(self) -> Any:
        """The transformers class of the family's image-text-to-text model."""
        raise NotImplementedError


_FAMILIES: dict[str, Family] = {}


def register(family: Family) -> Family:
    """Make ``family`` known by its name and model types."""
    _FAMILIES[family.name] = family
    return family


def families() -> list[Family]:
    """Every registered family, in registration order."""
    return list(_FAMILIES.values())


def _supported() -> str:
    return ", ".join(f"{f.label} ({f.name}: model_type {' / '.join(f.model_types)})" for f in _FAMILIES.values())


def get_family(name: str) -> Family:
    """The family called ``name`` (``qwen2_5_vl``, ``qwen3_vl``); a clear error naming the others."""
    if name in _FAMILIES:
        return _FAMILIES[name]
    for f in _FAMILIES.values():
        if name in f.model_types:
            return f
    raise UnsupportedModel(f"unknown model family {name!r}; supported: {_supported()}")


def family_of(config: Any) -> Family:
    """The family of a transformers config (``config.model_type``)."""
    model_type = getattr(config, "model_type", None)
    for f in _FAMILIES.values():
        if model_type in f.model_types:
            return f
    raise UnsupportedModel(f"mmagent cannot render for model_type {model_type!r}; supported families: "
                           f"{_supported()}")


def family_for_name(model: str | None, default: Family | None = None) -> Family:
    """The family a served model's name points to (``Qwen/Qwen3-VL-8B-Instruct`` -> Qwen3-VL), else ``default``
    (else the first registered family)."""
    name = (model or "").lower()
    for f in _FAMILIES.values():
        if any(h in name for h in f.name_hints):
            return f
    return default or next(iter(_FAMILIES.values()))


def seconds_text(seconds: float) -> str:
    """A time the way Qwen3-VL's processor writes it between video frames: ``<12.5 seconds>``."""
    return f"<{seconds:.1f} seconds>"
