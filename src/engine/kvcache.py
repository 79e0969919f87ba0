"""A KV cache whose layers grow in place: transformers' DynamicLayer concatenates the whole cache with
each new token (torch.cat: every step copies everything cached so far), which at Llama-2-7B's 32 layers
and a few hundred tokens of context is ~100 MB copied per step, and at 4000 tokens ~2 GB; on Gemma 3
270M the sliding-window layers' copies were 10% of a step.

Keys and values live in a buffer with room to spare and the filled part is a view, so a step writes
only its new rows; the buffer grows by a quarter (at least 256 positions) when full, copies amortised
to a few per position, never beyond 1.25x what the sequence uses (the memory estimate, src.assembly.memory,
allows for that). Cropping (a rejected draft) shortens the view. A sliding-window layer does so until
its window would trim the cache, then hands over to transformers' own logic for the rest of the
sequence (steps that far are transformers' forward anyway: src.engine.python_step stops at the window).
"""

from __future__ import annotations

import torch
from transformers import DynamicCache
from transformers.cache_utils import DynamicLayer, DynamicSlidingWindowLayer

MIN_GROWTH = 256
GROWTH = 0.25


class _Buffered:
    """The buffer and its views, for a DynamicLayer subclass (keys / values [batch, heads, length, dim])."""

    _k: torch.Tensor | None = None
    _v: torch.Tensor | None = None

    def _append(self, key_states: torch.Tensor, value_states: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        used = self.keys.shape[-2] if self._k is not None else 0
        new = key_states.shape[-2]
        if self._k is None or used + new > self._k.shape[-2]:
            self._grow(key_states, value_states, used, used + new)
        self._k[..., used : used + new, :].copy_(key_states)
        self._v[..., used : used + new, :].copy_(value_states)
        self.keys, self.values = self._k[..., : used + new, :], self._v[..., : used + new, :]
        return self.keys, self.values

    def _grow(self, key_states: torch.Tensor, value_states: torch.Tensor, used: int, needed: int) -> None:
        capacity = needed + max(MIN_GROWTH, int(needed * GROWTH))
        k = key_states.new_empty(*key_states.shape[:-2], capacity, key_states.shape[-1])
        v = value_states.new_empty(*value_states.shape[:-2], capacity, value_states.shape[-1])
        if used:
            k[..., :used, :].copy_(self.keys)
            v[..., :used, :].copy_(self.values)
        self._k, self._v = k, v


class GrowingLayer(_Buffered, DynamicLayer):
    """DynamicLayer, its keys and values views of a buffer."""

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        return self._append(key_states, value_states)

    def reset(self) -> None:
        self._k = self._v = None
        super().reset()


class GrowingSlidingLayer(_Buffered, DynamicSlidingWindowLayer):
    """DynamicSlidingWindowLayer, in a buffer while the window keeps everything (cumulative length below
    the window: transformers' layer keeps the last window - 1 positions), its own logic after, recording the past
    (transformers' record_past): each forward's states are kept until the next crop, so a rejected draft can be
    cropped once the window is full (transformers' layer had refused: a draft rejected past a sliding window ended
    the decode). native.Decoder crops after every verification, restricting the layer to its window again."""

    spilled = False

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        if not self.spilled and self.cumulative_length + key_states.shape[-2] <= self.sliding_window - 1:
            self.cumulative_length += key_states.shape[-2]
            return self._append(key_states, value_states)
        if not self.spilled:  # the buffer's positions become transformers' layer's, past kept from here on
            self.spilled, self._k, self._v, self.record_past = True, None, None, True
        return super().update(key_states, value_states, *args, **kwargs)

    def reset(self) -> None:
        self.spilled, self._k, self._v, self.record_past = False, None, None, False
        super().reset()


def growing_cache(config) -> DynamicCache:
    """transformers' DynamicCache for this model, each layer its growing counterpart."""
    cache = DynamicCache(config=config)
    cache.layers = [
        GrowingLayer()
        if type(layer) is DynamicLayer
        else GrowingSlidingLayer(layer.sliding_window)
        if type(layer) is DynamicSlidingWindowLayer
        else layer
        for layer in cache.layers
    ]
    return cache
