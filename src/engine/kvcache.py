"""A KV cache whose layers grow in place: transformers' DynamicLayer concatenates the whole cache with
each new token (torch.cat: every step copies everything cached so far), which at Llama-2-7B's 32 layers
and a few hundred tokens of context is ~100 MB copied per step, and at 4000 tokens ~2 GB.

`GrowingLayer` keeps keys and values in a buffer with room to spare and exposes the filled part as a
view, so a step writes only its new rows; the buffer grows by a quarter (at least 256 positions) when
full, copies amortised to a few per position, and never beyond 1.25x what the sequence uses (the memory
estimate's KV cache, src.memory, allows for that). Cropping (a rejected draft) shortens the view.
"""

from __future__ import annotations

import torch
from transformers import DynamicCache
from transformers.cache_utils import DynamicLayer

MIN_GROWTH = 256
GROWTH = 0.25


class GrowingLayer(DynamicLayer):
    """DynamicLayer's interface (keys / values are [batch, heads, length, head_dim]), views of a buffer."""

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        super().lazy_initialization(key_states, value_states)
        self._k = self._v = None

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        used, new = self.get_seq_length(), key_states.shape[-2]
        if self._k is None or used + new > self._k.shape[-2]:
            self._grow(key_states, value_states, used + new)
        self._k[..., used:used + new, :].copy_(key_states)
        self._v[..., used:used + new, :].copy_(value_states)
        self.keys, self.values = self._k[..., :used + new, :], self._v[..., :used + new, :]
        return self.keys, self.values

    def _grow(self, key_states: torch.Tensor, value_states: torch.Tensor, needed: int) -> None:
        capacity = needed + max(MIN_GROWTH, int(needed * GROWTH))
        used = self.get_seq_length()
        k = key_states.new_empty(*key_states.shape[:-2], capacity, key_states.shape[-1])
        v = value_states.new_empty(*value_states.shape[:-2], capacity, value_states.shape[-1])
        if used:
            k[..., :used, :].copy_(self.keys)
            v[..., :used, :].copy_(self.values)
        self._k, self._v = k, v

    def reset(self) -> None:
        self._k = self._v = None
        super().reset()


def growing_cache(config) -> DynamicCache:
    """transformers' DynamicCache for this model, its full-attention layers made GrowingLayers (sliding
    window layers keep their own class, which already bounds what they copy)."""
    cache = DynamicCache(config=config)
    cache.layers = [GrowingLayer() if type(layer) is DynamicLayer else layer for layer in cache.layers]
    return cache
