"""The growing KV cache (src/engine/kvcache.py): DynamicLayer's contents, without copying the cache per step."""

import torch
from transformers.cache_utils import DynamicLayer

from src.engine.kvcache import MIN_GROWTH, GrowingLayer, growing_cache
from src.tiny import tiny_model


def _kv(n: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(1, 2, n, 16, generator=g), torch.randn(1, 2, n, 16, generator=g)


def test_updates_and_crops_hold_what_dynamic_layer_holds_across_growth():
    ours, theirs = GrowingLayer(), DynamicLayer()
    # a prefill, steps, a verification, a rejected draft cropped, and growth past the first buffer
    moves = [("add", 40), *[("add", 1)] * 5, ("add", 6), ("crop", 4), ("add", MIN_GROWTH), ("crop", 1), ("add", 3)]
    for i, (move, n) in enumerate(moves):
        if move == "add":
            k, v = _kv(n, i)
            got, want = ours.update(k, v), theirs.update(k, v)
            assert all(torch.equal(a, b) for a, b in zip(got, want))
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


def test_the_models_full_attention_layers_grow_and_sliding_ones_keep_their_class():
    model, _ = tiny_model("gemma3")
    kinds = {type(layer).__name__ for layer in growing_cache(model.config).layers}
    assert "GrowingLayer" in kinds and "DynamicLayer" not in kinds
    assert len(kinds) == (2 if "sliding_attention" in model.config.layer_types else 1)
