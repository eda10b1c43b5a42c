"""The batch-synchronous tool loop users would otherwise pick (TRL's multi-turn GRPO loop), as a policy.

Not a script: ``rollout.py`` and ``rl_step.py`` import it as the baseline the rollout engine is measured
against. What it does each turn, as TRL's ``GRPOTrainer._tool_call_loop`` does with the transformers
backend:

* every open episode's whole conversation so far (first prompt, earlier turns, every observation with all
  its images and frames) is left-padded into one batch and run through ``model.generate`` with a fresh KV
  cache of its own: each turn re-prefills each episode's full conversation (TRL re-tokenises prompt +
  completion + tool results and calls ``generate`` again; only its vLLM path keeps a prefix cache);
* ``generate`` runs until the slowest row of the batch stops (finished rows are padded along);
* then every tool call of the turn is awaited before the next turn starts (the agent's lock-step
  :class:`~mmagent.policy.base.TurnStream`: ``joins_running = False``).

Two choices are in the baseline's favour, so the ratio is not inflated: tool calls run concurrently in the
agent's thread pool (TRL runs synchronous tools one after another), and the conversation is kept as the
episode's own token ids (no re-templating). Tokens are picked by the same chooser and stop rule as the
engine (:meth:`~mmagent.policy.hf.HFPolicy.pick`, inside a logits processor), so with greedy decoding the
two can only part where padding moves a logit across a near-tie; ``rollout.py`` checks they do not.
"""

from __future__ import annotations

import time
from typing import Any, Sequence

import torch
from transformers import GenerationConfig, LogitsProcessor, StoppingCriteria

from mmagent.policy.base import Generation, TurnStream
from mmagent.policy.batching import TurnInProgress
from mmagent.policy.hf import HFPolicy, HFSession
from mmagent.policy.segments import VISION_INPUTS, on_device


def left_padded(rows: Sequence[dict[str, torch.Tensor]], pad_id: int) -> dict[str, torch.Tensor]:
    """One batch from single-episode inputs (``HFPolicy.model_inputs``): ids and token types left-padded with
    an attention mask, vision inputs concatenated in row order (what a processor returns for a batch).
    Positions are left to the model, which computes M-RoPE from the ids, the grids and the mask."""
    width = max(r["input_ids"].shape[1] for r in rows)
    ids = torch.full((len(rows), width), pad_id, dtype=torch.long)
    types = torch.zeros((len(rows), width), dtype=torch.long)
    mask = torch.zeros((len(rows), width), dtype=torch.long)
    for k, r in enumerate(rows):
        n = r["input_ids"].shape[1]
        ids[k, width - n:] = r["input_ids"][0]
        types[k, width - n:] = r["mm_token_type_ids"][0]
        mask[k, width - n:] = 1
    batch = {key: torch.cat([r[key] for r in rows if key in r]) for key in VISION_INPUTS if any(key in r for r in rows)}
    batch.update(input_ids=ids, attention_mask=mask, mm_token_type_ids=types)
    return batch


class _Picker(LogitsProcessor):
    """Each row's next token by the policy's own rule (chooser, blocked vision tokens, stop strings); the
    scores ``generate`` sees are forced to it, so ``generate`` only runs the model."""

    def __init__(self, policy: HFPolicy, turns: Sequence[TurnInProgress], max_new_tokens: int) -> None:
        self.policy, self.turns, self.max_new_tokens = policy, list(turns), max_new_tokens
        self.pad = policy.tokenizer.pad_token_id or 0

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor) -> torch.FloatTensor:
        forced = torch.full_like(scores, float("-inf"))
        for row, turn in enumerate(self.turns):
            if turn.done:
                forced[row, self.pad] = 0.0
                continue
            self.policy.pick(turn, scores[row].clone(), self.max_new_tokens)
            forced[row, turn.generated[-1]] = 0.0
        return forced


class _Stop(StoppingCriteria):
    """Stop ``generate`` once every row's turn is done (each row's own stop is applied by the picker)."""

    def __init__(self, picker: _Picker) -> None:
        self.picker = picker

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor, **kwargs: Any) -> torch.BoolTensor:
        return torch.tensor([t.done for t in self.picker.turns], device=input_ids.device)


class BatchSyncPolicy(HFPolicy):
    """:class:`~mmagent.policy.hf.HFPolicy` run batch-synchronously: one padded ``model.generate`` over all
    the open episodes per turn, every tool awaited before the next (see the module docstring)."""

    def stream(self, max_new_tokens: int) -> TurnStream:
        return TurnStream(self, max_new_tokens)  # lock-step: the agent awaits every tool before each step

    @torch.inference_mode()
    def generate(self, sessions: Sequence[HFSession], max_new_tokens: int) -> list[Generation]:
        if not sessions:
            return []
        t0 = time.perf_counter()
        turns = []
        for s in sessions:
            self.chooser.begin_turn(s, self.tokenizer)
            turns.append(TurnInProgress(s, start=s.counter, prefilled=len(s.token_ids), t0=t0))
        pad = self.tokenizer.pad_token_id or 0
        inputs = on_device(self.model, left_padded([self.model_inputs(s) for s in sessions], pad))
        picker = _Picker(self, turns, max_new_tokens)
        config = GenerationConfig(do_sample=False, max_new_tokens=max_new_tokens, pad_token_id=pad,
                                  eos_token_id=None, bos_token_id=None)
        self.model.generate(**inputs, generation_config=config, logits_processor=[picker],
                            stopping_criteria=[_Stop(picker)])
        seconds = time.perf_counter() - t0
        return [self.finish_turn(t, seconds) for t in turns]
