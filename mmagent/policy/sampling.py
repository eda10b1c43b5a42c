"""How the next token is picked: the sampling settings, and the choosers the transformers backend calls.

:class:`SamplingConfig` is what every backend takes (greedy at ``temperature == 0``). The transformers backend
picks each token through a :class:`TokenChooser`: :class:`Sampler` samples from the logits with a generator
seeded per session (so an episode is reproducible whatever batch it runs in);
:class:`~mmagent.policy.replay.ReplayChooser` forces scripted turns instead (tests, SFT data).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

import torch


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


class TokenChooser(Protocol):
    """Picks each next token of a session (whose ``sampling`` says how); ``begin_turn`` starts a turn."""

    def begin_turn(self, session: Any, tokenizer: Any) -> None: ...

    def choose(self, logits: torch.Tensor, session: Any) -> int: ...


class Sampler:
    """Greedy or temperature/top-p/top-k sampling, by each session's ``sampling``, with its seeded generator."""

    def begin_turn(self, session: Any, tokenizer: Any) -> None:
        if session.rng is None:
            session.rng = torch.Generator().manual_seed(session.seed)

    def choose(self, logits: torch.Tensor, session: Any) -> int:
        cfg: SamplingConfig = session.sampling
        if cfg.temperature == 0:
            return int(torch.argmax(logits))
        logits = logits / cfg.temperature
        if cfg.top_k > 0:
            kth = torch.topk(logits, min(cfg.top_k, logits.numel())).values[-1]
            logits = logits.masked_fill(logits < kth, float("-inf"))
        probs = torch.softmax(logits, dim=-1)
        if cfg.top_p < 1:
            sorted_p, order = torch.sort(probs, descending=True)
            drop = torch.cumsum(sorted_p, 0) - sorted_p > cfg.top_p
            sorted_p[drop] = 0
            probs = torch.zeros_like(probs).scatter_(0, order, sorted_p)
        return int(torch.multinomial(probs, 1, generator=session.rng))
