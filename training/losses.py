"""Token-level losses for SFT and for PPO-clip policy updates (GRPO / DGRPO).

Everything works on (B, T) tensors of per-token log-probabilities with a (B, T) mask that is 1 on the
policy's own tokens: prompt, observation and padding tokens never carry loss. Aggregation over tokens
follows TRL's names, because they change what a long answer weighs:

* ``grpo`` — mean over each sequence's active tokens, then mean over sequences;
* ``dapo`` — sum over every active token / number of active tokens (all tokens weigh the same);
* ``dr_grpo`` — sum / (B * T): no length normalisation at all;
* ``bnpo`` — like ``dapo`` but meant for the local batch only; with several processes ``dapo`` would
  divide by the global token count, ``bnpo`` by each process's own.
"""

from __future__ import annotations

import torch

AGGREGATIONS = ("grpo", "dapo", "dr_grpo", "bnpo")


def token_logprobs(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """log p(target) per position: (B, T, V) logits and (B, T) targets -> (B, T), in float32."""
    logp = torch.log_softmax(logits.float(), dim=-1)
    return logp.gather(-1, targets.long().unsqueeze(-1)).squeeze(-1)


def aggregate(per_token: torch.Tensor, mask: torch.Tensor, aggregation: str = "grpo") -> torch.Tensor:
    """Reduce a (B, T) per-token loss over the active tokens (see the module docstring)."""
    mask = mask.to(per_token.dtype)
    masked = per_token * mask
    if aggregation == "grpo":
        per_seq = masked.sum(-1) / mask.sum(-1).clamp(min=1)
        return per_seq.mean()
    if aggregation in ("dapo", "bnpo"):
        return masked.sum() / mask.sum().clamp(min=1)
    if aggregation == "dr_grpo":
        return masked.sum() / (per_token.shape[0] * per_token.shape[1])
    raise ValueError(f"unknown aggregation {aggregation!r}; choose from {', '.join(AGGREGATIONS)}")


def policy_loss(logp: torch.Tensor, old_logp: torch.Tensor, advantages: torch.Tensor, mask: torch.Tensor,
                clip_eps: float = 0.2, clip_eps_high: float | None = None, ref_logp: torch.Tensor | None = None,
                kl_coef: float = 0.0, aggregation: str = "grpo") -> tuple[torch.Tensor, dict[str, float]]:
    """PPO-clip loss on the policy's tokens, with an optional k3 KL to a reference.

    ``advantages`` is one number per sequence (B,), broadcast over its tokens. Returns the loss and stats
    (``clip_frac``: share of active tokens whose ratio was clipped; ``ratio``: mean ratio; ``kl``: mean KL).
    """
    high = clip_eps if clip_eps_high is None else clip_eps_high
    adv = advantages.to(logp.dtype).reshape(-1, 1)
    ratio = torch.exp(logp - old_logp.detach())
    clipped = torch.clamp(ratio, 1 - clip_eps, 1 + high)
    objective = torch.minimum(ratio * adv, clipped * adv)
    per_token = -objective
    m = mask.to(logp.dtype)
    kl_mean = 0.0
    if ref_logp is not None and kl_coef > 0:
        delta = ref_logp.detach() - logp
        kl = torch.exp(delta) - delta - 1  # k3: unbiased, always >= 0
        per_token = per_token + kl_coef * kl
        kl_mean = float((kl.detach() * m).sum() / m.sum().clamp(min=1))  # a logged figure, not part of the graph
    loss = aggregate(per_token, mask, aggregation)
    with torch.no_grad():
        active = m.sum().clamp(min=1)
        was_clipped = ((ratio < 1 - clip_eps) | (ratio > 1 + high)).to(m.dtype) * m
        stats = {"clip_frac": float(was_clipped.sum() / active), "ratio": float((ratio * m).sum() / active),
                 "kl": kl_mean}
    return loss, stats


def sft_loss(logits: torch.Tensor, targets: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Cross entropy averaged over the active (mask 1) tokens: (B, T, V), (B, T), (B, T) -> scalar."""
    nll = -token_logprobs(logits, targets)
    m = mask.to(nll.dtype)
    return (nll * m).sum() / m.sum().clamp(min=1)
