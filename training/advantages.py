"""Advantages for group-relative RL: GRPO, and DGRPO's difficulty-aware weighting across tasks.

GRPO: each prompt is rolled out G times; a rollout's advantage is its reward minus the group's mean,
over the group's (population) std. A group whose rewards are all equal says nothing about which
rollout was better: its advantages are 0 and it is flagged ``zero_variance`` so the trainer skips it.

DGRPO (VITAL) weighs those advantages by difficulty, at two levels:

* sample level (as in VITAL's code): the group's advantages times ``(1 + d_g) / 2`` with
  ``d_g = clip(1 - mean success of the group, 0, 1)`` — a prompt the policy already solves counts half;
* task level (the paper's task-specific weight, driven online): ``w_f = d_f / mean(d_f over the batch's
  families)`` with ``d_f = 1 - running success rate of family f`` (before this batch), clipped — so an
  easy family does not drown a hard one in gradient, nor the other way round.

Success rates are tracked per family and per prompt by :class:`DifficultyTracker` (an EMA; saved in
checkpoints). GRPO mode updates the tracker too, so logs show the same rates, but does not use it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Sequence

import numpy as np


def is_zero_variance(rewards: Sequence[float]) -> bool:
    """True when a group's rewards are all equal: it says nothing about which rollout was better."""
    return float(np.std(np.asarray(rewards, dtype=float))) < 1e-8


def group_advantages(rewards: Sequence[float], eps: float = 1e-6) -> list[float]:
    """(r - mean) / (std + eps) within one group; all zeros when the rewards are equal."""
    if is_zero_variance(rewards):
        return [0.0] * len(rewards)
    r = np.asarray(rewards, dtype=float)
    return ((r - r.mean()) / (r.std() + eps)).tolist()


@dataclass
class DifficultyTracker:
    """Running success rate per key (a task family or a prompt id): EMA with ``momentum``."""

    momentum: float = 0.9
    initial: float = 0.5
    rates: dict[str, float] = field(default_factory=dict)

    def rate(self, key: str) -> float:
        return self.rates.get(key, self.initial)

    def update(self, key: str, successes: Sequence[float]) -> float:
        if len(successes):
            self.rates[key] = self.momentum * self.rate(key) + (1 - self.momentum) * float(np.mean(successes))
        return self.rate(key)

    def state_dict(self) -> dict[str, Any]:
        return {"momentum": self.momentum, "initial": self.initial, "rates": dict(self.rates)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.momentum, self.initial, self.rates = state["momentum"], state["initial"], dict(state["rates"])


@dataclass
class AdvantageConfig:
    #: grpo (baseline) | dgrpo (difficulty-aware)
    mode: str = "dgrpo"
    eps: float = 1e-6
    #: bounds of the task-level weight
    task_weight_clip: tuple[float, float] = (0.5, 2.0)

    def __post_init__(self) -> None:
        if self.mode not in ("grpo", "dgrpo"):
            raise ValueError(f"unknown advantage mode {self.mode!r}; use grpo or dgrpo")
        self.task_weight_clip = tuple(self.task_weight_clip)  # type: ignore[assignment]


@dataclass
class AdvantageResult:
    advantages: list[list[float]]
    zero_variance: list[bool]
    stats: dict[str, Any]


def _get(group: Any, name: str) -> Any:
    return group[name] if isinstance(group, dict) else getattr(group, name)


def compute_advantages(groups: Sequence[Any], tracker: DifficultyTracker, cfg: AdvantageConfig | None = None
                       ) -> AdvantageResult:
    """Advantages for each group (with ``family``, ``prompt_id``, ``rewards``, ``successes``); updates ``tracker``."""
    cfg = cfg or AdvantageConfig()
    families = sorted({_get(g, "family") for g in groups})
    difficulty = {f: 1.0 - tracker.rate(f) for f in families}
    mean_d = float(np.mean(list(difficulty.values()))) if families else 0.0
    lo, hi = cfg.task_weight_clip
    task_weight = {f: (float(np.clip(d / mean_d, lo, hi)) if mean_d > 0 else 1.0) for f, d in difficulty.items()}
    advantages, zero = [], []
    for g in groups:
        rewards, successes = _get(g, "rewards"), _get(g, "successes")
        adv = group_advantages(rewards, cfg.eps)
        is_zero = is_zero_variance(rewards)
        if cfg.mode == "dgrpo" and not is_zero:
            d_g = float(np.clip(1.0 - np.mean(successes), 0.0, 1.0))
            scale = (1.0 + d_g) / 2.0 * task_weight[_get(g, "family")]
            adv = [a * scale for a in adv]
        advantages.append(adv)
        zero.append(is_zero)
    for f in families:
        tracker.update(f, [s for g in groups if _get(g, "family") == f for s in _get(g, "successes")])
    for g in groups:
        tracker.update(f"prompt:{_get(g, 'prompt_id')}", _get(g, "successes"))
    all_rewards = [r for g in groups for r in _get(g, "rewards")]
    stats = {"mean_reward": float(np.mean(all_rewards)) if all_rewards else 0.0,
             "zero_variance_share": float(np.mean(zero)) if zero else 0.0,
             "task_weights": task_weight if cfg.mode == "dgrpo" else {f: 1.0 for f in families},
             "success_rates": {f: tracker.rate(f) for f in families}}
    return AdvantageResult(advantages, zero, stats)
