"""Continuous batching for the transformers backend: open episodes prefill and decode together.

:class:`DecodeStream` is the :class:`~mmagent.policy.base.TurnStream` the agent drives. The sessions that are
ready prefill their new tokens in one forward (:func:`forward_many`: each row's cache and new tokens
left-padded, the padding masked), their caches join the stacked, left-padded decode batch
(:class:`~mmagent.policy.kv_cache.StackedCache`), and every decode step is one forward for all rows, each
with its own positions. A session whose turn stops leaves at once with its cache row; one whose tool result
arrives joins between two tokens, so no episode waits for another's turn or tool. The first prompts'
shared head (system prompt and tool schemas, up to the first image or video) is computed once per stream
and copied (:class:`SharedPrefixes`). Greedy results equal the one-at-a-time loop's token for token (the
tests check this).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Sequence

import torch
from transformers import DynamicCache

from mmagent.policy.base import Generation, Session, TurnStream
from mmagent.policy.kv_cache import StackedCache
from mmagent.policy.segments import VISION_INPUTS, Segment, concat_segments, on_device, text_positions

if TYPE_CHECKING:
    from mmagent.policy.hf import HFPolicy, HFSession


@dataclass
class TurnInProgress:
    """A policy turn being generated."""

    session: "HFSession"
    start: int
    prefilled: int
    t0: float
    logits: Any = None
    generated: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    truncated: bool = False
    done: bool = False


class SharedPrefixes:
    """KV caches of first-prompt prefixes that several episodes share (the system prompt with the tool
    schemas, up to the first image or video), computed once and copied into each new episode's cache.

    Only the text before the first vision token is shared: its keys and values do not depend on what
    follows. A store lives for one stream (one ``run_batch``), so weights changed by training between
    rollouts never meet a stale prefix.
    """

    #: shorter shared text is not worth a lookup
    MIN_TOKENS = 16

    def __init__(self, max_entries: int = 4) -> None:
        self.max_entries = max_entries
        self.entries: dict[tuple[int, ...], Any] = {}
        #: tokens served from a stored prefix instead of being run through the model again
        self.reused_tokens = 0

    def cache_for(self, policy: "HFPolicy", seg: Segment) -> tuple[Any, int, int]:
        """(a fresh cache holding ``seg``'s shared head, the head's length, tokens computed for it now)."""
        vision = (seg.mm_types != 0).nonzero()
        head = int(vision[0]) if len(vision) else len(seg.ids) - 1  # keep one token to forward for the logits
        if head < self.MIN_TOKENS:
            return None, 0, 0
        key = tuple(seg.ids[:head].tolist())
        stored, computed = self.entries.get(key), 0
        if stored is None:
            stored = DynamicCache(config=policy.model.config)
            dev = policy.device
            ids = seg.ids[:head][None].to(dev)
            policy.model(input_ids=ids, position_ids=seg.positions[:, None, :head].to(dev),
                         mm_token_type_ids=torch.zeros_like(ids), cache=stored, use_cache=True, logits_to_keep=1)
            if len(self.entries) >= self.max_entries:
                self.entries.pop(next(iter(self.entries)))
            self.entries[key] = stored
            computed = head
        else:
            self.reused_tokens += head
        data = [(layer.keys.clone(), layer.values.clone()) for layer in stored.layers]
        return DynamicCache(ddp_cache_data=data, config=policy.model.config), head, computed


def forward_many(policy: "HFPolicy", sessions: Sequence["HFSession"], work: Sequence[Sequence[Segment]]
                 ) -> torch.Tensor:
    """``work[i]`` run on top of ``sessions[i]``'s cache for every i in one forward; the last logits of each.

    The caches are stacked left-padded and each row's new tokens left-padded after them, so a row
    reads ``[pad, its cache, pad, its new tokens]`` with the padding masked out. Each session then
    gets its own cache back without the padding.
    """
    config, dev = policy.model.config, policy.device
    stacked = StackedCache.of([s.cache for s in sessions], config, roomy=False)
    chunks = [concat_segments(segments) for segments in work]
    lengths = [c["input_ids"].shape[1] for c in chunks]
    rows, past, width = len(chunks), stacked.width, max(lengths)
    pad = policy.tokenizer.pad_token_id or 0
    ids = torch.full((rows, width), pad, dtype=torch.long)
    types = torch.zeros((rows, width), dtype=torch.long)
    positions = torch.zeros((3, rows, width), dtype=torch.long)
    mask = torch.zeros((rows, past + width), dtype=torch.long)
    for r, (chunk, n) in enumerate(zip(chunks, lengths)):
        ids[r, width - n:] = chunk["input_ids"][0]
        types[r, width - n:] = chunk["mm_token_type_ids"][0]
        positions[:, r, width - n:] = chunk["position_ids"][:, 0]
        mask[r, past - stacked.lengths[r]:past] = 1
        mask[r, past + width - n:] = 1
    inputs = {key: torch.cat([c[key] for c in chunks if key in c])
              for key in VISION_INPUTS if any(key in c for c in chunks)}
    inputs.update(input_ids=ids, position_ids=positions, attention_mask=mask, mm_token_type_ids=types)
    out = policy.model(**on_device(policy.model, inputs), cache=stacked.cache, use_cache=True, logits_to_keep=1)
    for r, session in enumerate(sessions):
        real = mask[r].nonzero().squeeze(1).to(dev)
        session.cache = DynamicCache(config=config, ddp_cache_data=[
            (layer.keys[r:r + 1].index_select(2, real), layer.values[r:r + 1].index_select(2, real))
            for layer in stacked.cache.layers])
    return out.logits[:, -1].float()


class DecodeStream(TurnStream):
    """Continuous batching over KV caches: sessions join and leave a running decode batch between tokens.

    Each :meth:`step` first prefills the sessions added since the last one (their new tokens on their own
    caches) and stacks their caches into the batch, then runs one decode forward for every row. A row whose
    turn stops leaves at once with its cache; a session whose tool result arrives joins at the next step,
    so no episode waits for another's turn or tool call.
    """

    joins_running = True

    def __init__(self, policy: "HFPolicy", max_new_tokens: int) -> None:
        super().__init__(policy, max_new_tokens)
        self.policy: HFPolicy = policy
        self.active: list[TurnInProgress] = []
        self.batch: StackedCache | None = None
        self.prefixes = SharedPrefixes()
        #: the most memory the stacked caches took at any decode step (what the visual budget keeps bounded)
        self.peak_cache_bytes = 0
        #: token limits of sessions added with their own (``mmagent serve``: each request's ``max_tokens``)
        self.limits: dict[int, int] = {}

    def add(self, session: Session, max_new_tokens: int | None = None) -> None:
        """Add ``session`` for its next turn; ``max_new_tokens`` overrides the stream's limit for this turn."""
        super().add(session)
        if max_new_tokens is not None:
            self.limits[id(session)] = int(max_new_tokens)

    def _limit(self, turn: TurnInProgress) -> int:
        return self.limits.get(id(turn.session), self.max_new_tokens)

    def __len__(self) -> int:
        return len(self.waiting) + len(self.active)

    def sessions(self) -> list[Session]:
        return self.waiting + [t.session for t in self.active]

    def partial(self) -> list[tuple[Session, list[int]]]:
        """Each session mid-turn and the tokens it has generated so far (what a server streams out)."""
        return [(t.session, list(t.generated)) for t in self.active]

    @torch.inference_mode()
    def step(self) -> list[tuple[Session, Generation]]:
        p = self.policy
        ended: list[TurnInProgress] = []
        if self.waiting:
            joining, self.waiting = self.waiting, []
            fresh = []
            for t in p.begin_turns(joining, self.prefixes):
                p.pick(t, t.logits, self._limit(t))
                (ended if t.done else fresh).append(t)
            if fresh:
                self._join(fresh)
        if self.active:
            ended += self._decode()
        now = time.perf_counter()
        for t in ended:
            self.limits.pop(id(t.session), None)
        return [(t.session, p.finish_turn(t, now - t.t0)) for t in ended]

    def _join(self, turns: list[TurnInProgress]) -> None:
        caches = [t.session.cache for t in turns]
        config = self.policy.model.config
        if self.batch is None:
            self.batch = StackedCache.of(caches, config)
        else:
            self.batch.extend(caches)
        for t in turns:
            t.session.cache = None  # the batch holds the only copy; the row comes back when the turn ends
        self.active += turns

    def _decode(self) -> list[TurnInProgress]:
        p, batch, dev = self.policy, self.batch, self.policy.device
        ids = torch.tensor([[t.generated[-1]] for t in self.active], device=dev)
        positions = torch.stack([text_positions(1, t.start + len(t.generated) - 1) for t in self.active], dim=1)
        out = p.model(input_ids=ids, position_ids=positions.to(dev), attention_mask=batch.next_mask().to(dev),
                      mm_token_type_ids=torch.zeros_like(ids), cache=batch.cache, use_cache=True, logits_to_keep=1)
        batch.grew()
        self.peak_cache_bytes = max(self.peak_cache_bytes, batch.nbytes())
        logits = out.logits[:, -1].float()
        for row, t in enumerate(self.active):
            p.pick(t, logits[row], self._limit(t))
        ended = [t for t in self.active if t.done]
        if ended:
            config = p.model.config
            for row, t in enumerate(self.active):
                if t.done:
                    t.session.cache = batch.unstack(row, config)
            keep = [row for row, t in enumerate(self.active) if not t.done]
            self.active = [self.active[row] for row in keep]
            if keep:
                batch.select(keep)
            else:
                self.batch = None
        return ended
