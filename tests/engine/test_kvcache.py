"""The growing KV cache (src/engine/kvcache.py): transformers' layers' contents, without copying the cache per step."""

import pytest
import torch
from transformers.cache_utils import DynamicLayer, DynamicSlidingWindowLayer

from src.engine.kvcache import MIN_GROWTH, GrowingLayer, GrowingSlidingLayer, growing_cache
from src.models.tiny import tiny_model


def _kv(n: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(1, 2, n, 16, generator=g), torch.randn(1, 2, n, 16, generator=g)


# a prefill, steps, a verification, a rejected draft cropped, growth past the first buffer (and, for a
# window of 310, past the window: the sliding layer hands over to transformers' logic there, and drafts rejected
# past it are cropped, as native.Decoder crops after each verification: by their length, or by 0)
MOVES = [
    ("add", 40),
    *[("add", 1)] * 5,
    ("add", 6),
    ("crop", 4),
    ("add", MIN_GROWTH),
    ("crop", 1),
    ("add", 3),
    *[("add", 1)] * 3,
    ("add", 8),
    ("add", 1),
    ("add", 5),
    ("crop", 3),
    ("add", 4),
    ("crop", 0),
]


@pytest.mark.parametrize("kind", ["full", "sliding"])
def test_updates_and_crops_hold_what_transformers_layers_hold(kind):
    if kind == "full":
        ours, theirs = GrowingLayer(), DynamicLayer()
    else:
        # transformers' layer recording its past, as ours does once it hands over: a crop past the window works
        ours, theirs = GrowingSlidingLayer(310), DynamicSlidingWindowLayer(310)
        theirs.activate_past_recording()
    for i, (move, n) in enumerate(MOVES):
        if move == "add":
            k, v = _kv(n, i)
            got, want = ours.update(k, v), theirs.update(k, v)
            assert all(torch.equal(a, b) for a, b in zip(got, want))
            if kind == "sliding":
                assert ours.get_mask_sizes(n) == theirs.get_mask_sizes(n)
        else:
            ours.crop(-n)
            theirs.crop(-n)
        assert ours.get_seq_length() == theirs.get_seq_length()
        assert torch.equal(ours.keys, theirs.keys) and torch.equal(ours.values, theirs.values)


def test_a_step_writes_into_the_buffer_instead_of_copying_the_cache():
    layer = GrowingLayer()
    layer.update(*_kv(100, 0))
    buffer = layer.keys.data_ptr()
    for i in range(20):
        keys, _ = layer.update(*_kv(1, i + 1))
        assert keys.data_ptr() == buffer and keys.shape[-2] == 101 + i


def test_every_layer_of_a_model_grows_in_place():
    model, _ = tiny_model("gemma3")
    kinds = {type(layer).__name__ for layer in growing_cache(model.config).layers}
    assert kinds == {"GrowingLayer", "GrowingSlidingLayer"}
