"""Vision pre-training: the tower and merger learn to tell apart what the toy world draws, before any words.

A real VLM's vision encoder comes to its language alignment already able to see (CLIP-style or
captioning pre-training on billions of images). A tiny random tower does not, and learning to see
through a language model's next-token loss is slow: the drill stage's words supervise a frame's shape
with one token, behind a language model that is itself still learning. This stage stands in for that
encoder pre-training. Each step draws fresh perception drill rounds (:mod:`mmagent.eval.synth.drills`:
flashed frames, screens, zoomed tags and signs, as the tools return them and fitted as the policy's
renderer fits them), and small classifier heads read every image's merged tokens (one attention-pooled
query per head) to name what it shows: a shape's colour and kind, a screen's colour, a tag's character
and colour, a sign's text (the classes are :func:`~mmagent.eval.synth.drills.image_heads`). Only the
vision tower, its merger and the heads train; the heads are dropped afterwards and the model is saved
with its new tower, ready for the drill stage (:mod:`mmagent.training.pretrain`) to put words to it.

The stage runs in phases (``phases``, then ``steps`` of ``mix``) under one warm-up-then-decay schedule:
lone characters on small crops first (``digit_glyph``), because a random tower does not find a
checker-inked character inside a whole zoom view, and does learn it where the label is all there is.

:func:`vision_accuracy` scores the tower the same way on fresh rounds (seeded apart from training's).
"""

from __future__ import annotations

import math
import time
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np
import torch
from torch import nn
from tqdm.auto import tqdm

from mmagent.eval.synth.drills import LABELLED, NONE, Round, image_heads, make_round
from mmagent.eval.synth.families import SynthConfig
from mmagent.policy.hf import HFPolicy
from mmagent.training.common import load_policy, save_final
from mmagent.training.pretrain import draw_kind, round_view, warmup_then_decay

#: how often each perception drill is drawn (rounds whose images carry labels)
DEFAULT_MIX = {"frames": 6.0, "screen": 0.5, "tag": 2.0, "sign": 2.0, "digit_glyph": 1.0, "glyph": 1.0}
#: the steps before the main mix: (steps, rounds a step, mix). Lone digits on small crops first: a random
#: tower learns to read the checker-inked characters there, and nowhere else (see ``drills.digit_glyph``)
DEFAULT_PHASES: tuple[tuple[int, int, dict[str, float]], ...] = ((700, 4, {"digit_glyph": 1.0}),)


@dataclass
class VisionPretrainConfig:
    #: folder of the starting checkpoint (a tiny random model from ``mmagent make-tiny``)
    model: str = ""
    #: where the model with its trained tower goes (a plain transformers folder plus ``mmagent.json``)
    output_dir: str = "runs/vision"
    steps: int = 600
    #: drill rounds per step (a frames, flash or screen round holds up to eight images)
    rounds_per_step: int = 32
    #: 1e-3: at the recipe's 700 + 600 x 32 steps, characters 0.23 and shapes 0.72, against 0.06 and 0.50 at 3e-3
    lr: float = 1e-3
    mix: dict[str, float] = field(default_factory=lambda: dict(DEFAULT_MIX))
    #: steps drawn before the main ``steps``: (steps, rounds a step, mix), in order
    phases: tuple[tuple[int, int, dict[str, float]], ...] = DEFAULT_PHASES
    #: share of all steps at the full rate before it decays (lone digits on crops: 0.99 after 700 steps at
    #: a constant 1e-3, 0.66 with the rate decaying from the start)
    hold: float = 0.6
    seed: int = 0
    device: str = "cpu"


class LabelHeads(nn.Module):
    """One attention-pooling query and one linear classifier per head, over an image's merged tokens."""

    def __init__(self, width: int, heads: dict[str, tuple[str, ...]]) -> None:
        super().__init__()
        self.names = list(heads)
        self.queries = nn.Parameter(torch.randn(len(heads), width) / math.sqrt(width))
        self.norm = nn.LayerNorm(width)
        self.out = nn.ModuleDict({n: nn.Linear(width, len(c)) for n, c in heads.items()})

    def forward(self, tokens: torch.Tensor, name: str) -> torch.Tensor:
        """Logits of head ``name`` for one image's (n, width) tokens."""
        x = self.norm(tokens)
        q = self.queries[self.names.index(name)]
        weights = torch.softmax(x @ q / math.sqrt(x.shape[-1]), dim=0)
        return self.out[name](weights @ x)


def _images_and_labels(policy: HFPolicy, rounds: list[Round]) -> tuple[list[Any], list[dict[str, str]]]:
    images, labels = [], []
    for r in rounds:
        shown = round_view(policy, r).images
        per_image = r.meta.get("images", [])
        if len(per_image) != len(shown):
            raise ValueError(f"a {r.kind} round labels {len(per_image)} of its {len(shown)} images")
        images += shown
        labels += per_image
    return images, labels


def image_tokens(policy: HFPolicy, images: list[Any]) -> list[torch.Tensor]:
    """Each image's merged vision tokens (what the language model is shown), through the real processor."""
    enc = policy.processor.image_processor(images=images, do_resize=False, return_tensors="pt")
    device = next(policy.model.parameters()).device
    out = policy.model.model.get_image_features(enc["pixel_values"].to(device), enc["image_grid_thw"].to(device))
    return list(out.pooler_output)


def _draw_rounds(rng: np.random.Generator, mix: dict[str, float], n: int, world: SynthConfig) -> list[Round]:
    return [make_round(draw_kind(rng, mix, tuple(mix)), rng, world) for _ in range(n)]


def _loss_and_hits(policy: HFPolicy, heads: LabelHeads, rounds: list[Round], classes: dict[str, tuple[str, ...]]
                   ) -> tuple[torch.Tensor, dict[str, list[int]]]:
    images, labels = _images_and_labels(policy, rounds)
    tokens = image_tokens(policy, images)
    losses, hits = [], {}
    for t, lab in zip(tokens, labels):
        for name, value in lab.items():
            logits = heads(t, name)
            target = classes[name].index(value)
            losses.append(nn.functional.cross_entropy(logits[None], torch.tensor([target], device=logits.device)))
            key = name if value != NONE else f"{name}:none"  # frames without a shape are scored apart
            hits.setdefault(key, []).append(int(int(logits.argmax()) == target))
    return torch.stack(losses).mean(), hits


def vision_pretrain(cfg: VisionPretrainConfig, progress: bool = True) -> dict[str, Any]:
    """Train the tower and merger with label heads; save the model to ``cfg.output_dir``; returns the losses,
    the heads' accuracy on fresh rounds and the time taken."""
    if not cfg.model:
        raise ValueError("vision pre-training needs model= (a checkpoint folder)")
    classes = image_heads()
    unknown = (set(cfg.mix) | {k for _, _, mix in cfg.phases for k in mix}) - set(LABELLED)
    if unknown:
        raise ValueError(f"drills without image labels in mix: {sorted(unknown)}; use {', '.join(LABELLED)}")
    torch.manual_seed(cfg.seed)
    policy = load_policy(cfg.model, device=cfg.device)
    model = policy.model
    visual = model.model.visual
    for p in model.parameters():
        p.requires_grad_(False)
    for p in visual.parameters():
        p.requires_grad_(True)
    width = model.config.get_text_config().hidden_size
    heads = LabelHeads(width, classes).to(next(visual.parameters()).device)
    params = list(visual.parameters()) + list(heads.parameters())
    optimizer = torch.optim.AdamW(params, lr=cfg.lr, weight_decay=0.0)
    plan = [(rounds, mix) for steps, rounds, mix in cfg.phases for _ in range(steps)]
    plan += [(cfg.rounds_per_step, cfg.mix)] * cfg.steps
    scheduler = warmup_then_decay(optimizer, len(plan), hold=cfg.hold)
    world = SynthConfig()
    visual.train()
    losses: list[float] = []
    t0 = time.perf_counter()
    bar = tqdm(plan, desc="vision", unit="step", disable=not progress)
    for step, (rounds, mix) in enumerate(bar):
        rng = np.random.default_rng([cfg.seed, 7, step])
        loss, _ = _loss_and_hits(policy, heads, _draw_rounds(rng, mix, rounds, world), classes)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        optimizer.step()
        scheduler.step()
        optimizer.zero_grad(set_to_none=True)
        losses.append(float(loss.detach()))
        if step % 10 == 0:
            bar.set_postfix(loss=f"{np.mean(losses[-20:]):.3f}")
    seconds = round(time.perf_counter() - t0, 1)
    visual.eval()
    for p in model.parameters():
        p.requires_grad_(True)
    accuracy = vision_accuracy(policy, heads, mix=cfg.mix)
    result = {"steps": cfg.steps, "all_steps": len(plan), "seconds": seconds,
              "loss": round(float(np.mean(losses[-50:])), 4),
              "accuracy": accuracy, "config": asdict(cfg)}
    save_final(model, policy, cfg.output_dir, about={"trained_by": "mmagent vision pre-training", "vision": result})
    return result


@torch.no_grad()
def vision_accuracy(policy: HFPolicy, heads: LabelHeads, rounds: int = 48, seed: int = 54321,
                    mix: dict[str, float] | None = None) -> dict[str, float]:
    """Per head, the share of images of fresh rounds whose label the tower and heads name right."""
    classes = image_heads()
    rng = np.random.default_rng([seed])
    drawn = _draw_rounds(rng, mix or DEFAULT_MIX, rounds, SynthConfig())
    hits: dict[str, list[int]] = {}
    for k in range(0, rounds, 16):
        _, h = _loss_and_hits(policy, heads, drawn[k:k + 16], classes)
        for name, v in h.items():
            hits.setdefault(name, []).extend(v)
    return {name: round(float(np.mean(v)), 3) for name, v in sorted(hits.items())}
