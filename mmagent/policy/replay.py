"""Forcing scripted turns through a real model: the test double for generation, and SFT data's encoder.

:class:`ReplayChooser` plugs into :class:`~mmagent.policy.hf.HFPolicy` in place of the sampler. At
each turn it tokenizes the scripted text with the real tokenizer and emits those tokens one by one;
everything else — the processor, the vision encoder, the KV cache, the positions, the stop strings,
the tools — runs for real. Tests use it to drive multi-turn episodes that a random model would never
produce, and oracle trajectories for the SFT cold start are encoded the same way, so their token ids
and loss masks are exactly what the policy would have produced.
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

import torch

from mmagent.policy.hf import HFSession

#: script(session, turn_index) -> the text of that turn, or None when the script has no more turns
Script = Callable[[HFSession, int], "str | None"]


class ReplayChooser:
    """Emit the scripted text of each turn, token by token, ignoring the model's logits.

    ``script`` is a list of turn texts (the same for every episode), a dict from task id (the session's
    :attr:`~mmagent.policy.base.Session.task`) to such a list, or a callable ``(session, turn) -> text``.
    Past the end of its script an episode gets an empty turn (end of turn at once), which the agent reports
    as a turn without an action.
    """

    def __init__(self, script: Sequence[str] | dict[str, Sequence[str]] | Script) -> None:
        if callable(script):
            self._script = script
        elif isinstance(script, dict):
            table = {k: list(v) for k, v in script.items()}
            self._script = lambda s, t: _nth(table.get(s.task.id if s.task is not None else "", []), t)
        else:
            turns = list(script)
            self._script = lambda s, t: _nth(turns, t)
        self._queues: dict[int, list[int]] = {}
        self._end_id: int | None = None

    def begin_turn(self, session: HFSession, tokenizer: Any) -> None:
        text = self._script(session, session.turn)
        self._end_id = tokenizer.convert_tokens_to_ids("<|im_end|>")
        ids = tokenizer.encode(text, add_special_tokens=False) if text else []
        self._queues[id(session)] = list(ids)

    def choose(self, logits: torch.Tensor, session: HFSession) -> int:
        queue = self._queues.get(id(session), [])
        if queue:
            return queue.pop(0)
        return int(self._end_id)


def _nth(items: list[str], n: int) -> str | None:
    return items[n] if n < len(items) else None
