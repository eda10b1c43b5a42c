"""KV-cache structures for decoding several sessions together.

A session's cache is a transformers ``DynamicCache`` of its own. To decode open sessions as one batch their
caches are stacked (:class:`StackedCache`): left-padded to the longest, with the attention mask that hides
the padding, rows added when sessions join and taken out when their turns end. Full-attention layers of
the stack are :class:`RoomyLayer` s, which write each decoded token in place instead of copying the
whole cache every step.
"""

from __future__ import annotations

from typing import Any, Sequence

import torch
from transformers import DynamicCache
from transformers.cache_utils import DynamicLayer


class RoomyLayer(DynamicLayer):
    """A full-attention cache layer whose decoded tokens are written in place, into spare room at the end,
    instead of the whole cache being copied into a new tensor every step (``DynamicLayer``'s ``torch.cat``).

    ``keys`` / ``values`` are views of the first ``n`` columns. Code that replaces them (row selection,
    trimming) is fine: the next update sees they are no longer views of the buffer and re-buffers them.
    """

    SPARE = 64

    def __init__(self, keys: torch.Tensor, values: torch.Tensor) -> None:
        super().__init__()
        self.device, self.is_initialized = keys.device, True
        self._rebuffer(keys, values, 0)

    def _rebuffer(self, keys: torch.Tensor, values: torch.Tensor, extra: int) -> None:
        n = keys.shape[-2]
        self._k = keys.new_zeros(*keys.shape[:-2], n + extra + self.SPARE, keys.shape[-1])
        self._v = values.new_zeros(*values.shape[:-2], n + extra + self.SPARE, values.shape[-1])
        self._k[..., :n, :] = keys
        self._v[..., :n, :] = values
        self.keys, self.values = self._k[..., :n, :], self._v[..., :n, :]

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args: Any, **kwargs: Any
               ) -> tuple[torch.Tensor, torch.Tensor]:
        n, new = self.keys.shape[-2], key_states.shape[-2]
        mine = self.keys.data_ptr() == self._k.data_ptr() and self.keys.shape[:-2] == self._k.shape[:-2]
        if not mine or n + new > self._k.shape[-2]:
            self._rebuffer(self.keys, self.values, new)
        self._k[..., n:n + new, :] = key_states
        self._v[..., n:n + new, :] = value_states
        self.keys, self.values = self._k[..., :n + new, :], self._v[..., :n + new, :]
        return self.keys, self.values


class StackedCache:
    """Several sessions' KV caches as one batch, left-padded to the longest, with the attention mask."""

    def __init__(self, cache: Any, lengths: list[int]) -> None:
        self.cache = cache
        self.lengths = lengths  # real tokens per row
        self.width = max(lengths)

    @classmethod
    def of(cls, caches: Sequence[Any], config: Any, roomy: bool = True) -> "StackedCache":
        """``caches`` stacked; ``roomy``: with spare room to decode into (not for a one-off prefill)."""
        lengths = [c.get_seq_length() for c in caches]
        width = max(lengths)
        stacked = DynamicCache(config=config)
        for i, layer in enumerate(stacked.layers):
            keys = left_padded([c.layers[i].keys for c in caches], width)
            values = left_padded([c.layers[i].values for c in caches], width)
            if roomy and type(layer) is DynamicLayer:  # full attention: decode in place
                stacked.layers[i] = RoomyLayer(keys, values)
            else:
                layer.update(keys, values)
        return cls(stacked, lengths)

    def extend(self, caches: Sequence[Any]) -> None:
        """Add ``caches`` as new rows at the bottom (re-padding everything to the new width)."""
        lengths = [c.get_seq_length() for c in caches]
        width = max(self.width, *lengths)
        for i, layer in enumerate(self.cache.layers):
            layer.keys = left_padded([layer.keys] + [c.layers[i].keys for c in caches], width)
            layer.values = left_padded([layer.values] + [c.layers[i].values for c in caches], width)
        self.lengths += lengths
        self.width = width

    def nbytes(self) -> int:
        """Bytes allocated for keys and values (spare decoding room included)."""
        return sum(t.numel() * t.element_size() for layer in self.cache.layers
                   for t in (getattr(layer, "_k", layer.keys), getattr(layer, "_v", layer.values)))

    def next_mask(self) -> torch.Tensor:
        """The attention mask for one more token on every row: 0 on each row's left padding."""
        mask = torch.ones(len(self.lengths), self.width + 1, dtype=torch.long)
        for row, n in enumerate(self.lengths):
            mask[row, :self.width - n] = 0
        return mask

    def grew(self) -> None:
        self.lengths = [n + 1 for n in self.lengths]
        self.width += 1

    def unstack(self, row: int, config: Any) -> Any:
        """Row ``row`` as a cache of its own, without the padding."""
        start = self.width - self.lengths[row]
        data = [(layer.keys[row:row + 1, :, start:].clone(), layer.values[row:row + 1, :, start:].clone())
                for layer in self.cache.layers]
        return DynamicCache(ddp_cache_data=data, config=config)

    def select(self, rows: list[int]) -> None:
        index = torch.tensor(rows, dtype=torch.long)
        for layer in self.cache.layers:
            layer.keys = layer.keys.index_select(0, index.to(layer.keys.device))
            layer.values = layer.values.index_select(0, index.to(layer.values.device))
        self.lengths = [self.lengths[r] for r in rows]
        trim = self.width - max(self.lengths)  # columns that are padding on every remaining row
        if trim:
            for layer in self.cache.layers:
                layer.keys, layer.values = layer.keys[:, :, trim:], layer.values[:, :, trim:]
            self.width -= trim


def left_padded(tensors: Sequence[torch.Tensor], width: int) -> torch.Tensor:
    """(rows, heads, seq, dim) tensors left-padded with zeros to ``width`` on the sequence axis, stacked."""
    return torch.cat([torch.nn.functional.pad(t, (0, 0, width - t.shape[-2], 0)) for t in tensors])
