"""A conversation as model inputs: segments of token ids with their M-RoPE positions and vision inputs.

The transformers backend builds an episode segment by segment (the first prompt, each policy turn, each
observation) and runs only the new ones through the model on top of the KV cache. Laid end to end
(:func:`concat_segments`) the same segments are one forward's inputs for the whole episode: what training
computes its loss on and what the tests compare the cached path against.

Positions: Qwen2.5-VL's ``get_rope_index`` walks the sequence with a counter that text tokens advance by
one and a vision block advances by ``max(h, w) / merge``. Every segment ends with text, so a segment's
positions are its own ``get_rope_index`` shifted by the counter at its start; the test suite checks this
equals ``get_rope_index`` over the whole sequence.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Sequence

import torch

#: the processor outputs a segment's image and video placeholders need
VISION_INPUTS = ("pixel_values", "image_grid_thw", "pixel_values_videos", "video_grid_thw", "second_per_grid_ts")


@dataclass
class Segment:
    """A run of tokens with their M-RoPE positions and the vision inputs their placeholders need."""

    ids: torch.Tensor  # (L,)
    mm_types: torch.Tensor  # (L,) 0 text, 1 image, 2 video
    positions: torch.Tensor  # (3, L)
    vision: dict[str, torch.Tensor] = field(default_factory=dict)

    def tail(self, start: int) -> "Segment":
        """The tokens from ``start`` on (with all the vision inputs: ``start`` must come before any)."""
        return Segment(self.ids[start:], self.mm_types[start:], self.positions[:, start:], self.vision)

    @property
    def end_counter(self) -> int:
        # Segments end in text, whose next position is the last one plus one.
        return int(self.positions[:, -1].max()) + 1


def text_positions(n: int, start: int) -> torch.Tensor:
    """M-RoPE positions of ``n`` text tokens from ``start``: the same index on all three axes."""
    return torch.arange(start, start + n).expand(3, -1)


def text_segment(ids: Sequence[int], start: int) -> Segment:
    """Text tokens placed from position ``start``."""
    t = torch.tensor(list(ids), dtype=torch.long)
    return Segment(ids=t, mm_types=torch.zeros_like(t), positions=text_positions(len(t), start))


def concat_segments(segments: Sequence[Segment]) -> dict[str, torch.Tensor]:
    """Model inputs (batch of one) for segments laid end to end."""
    inputs: dict[str, torch.Tensor] = {
        "input_ids": torch.cat([s.ids for s in segments])[None],
        "position_ids": torch.cat([s.positions for s in segments], dim=1)[:, None],
        "mm_token_type_ids": torch.cat([s.mm_types for s in segments])[None],
    }
    for key in VISION_INPUTS:
        parts = [s.vision[key] for s in segments if key in s.vision]
        if parts:
            inputs[key] = torch.cat(parts)
    return inputs


def on_device(model: Any, inputs: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Model inputs on ``model``'s device, pixels in its dtype (``model`` may be a wrapped/prepared copy)."""
    param = next(model.parameters())
    out = {k: v.to(param.device) for k, v in inputs.items()}
    for key in ("pixel_values", "pixel_values_videos"):
        if key in out:
            out[key] = out[key].to(param.dtype)
    return out
