"""Greedy speculative decoding gives exactly the target's greedy output, whatever the drafter."""

import pytest
import torch

from src.engine import ENGINES, Sampling
from src.engine.speculative import ModelDrafter, PromptLookup, generate
from src.tiny import tiny_model

ARCHS = ["llama", "opt", "qwen2", "gemma3"]


def drafters(arch, target):
    other, _ = tiny_model(arch, seed=1)             # a different model: low acceptance
    same, _ = tiny_model(arch)                       # the target itself: everything accepted
    low = tiny_model(arch)[0].to(torch.bfloat16)     # self-speculation at a lower precision
    return {"prompt_lookup": PromptLookup(), "other": ModelDrafter(other), "same": ModelDrafter(same),
            "bf16_self": ModelDrafter(low)}


@pytest.mark.parametrize("exact", [True, False])
@pytest.mark.parametrize("arch", ARCHS)
def test_greedy_output_is_the_targets(arch, exact):
    model, tok = tiny_model(arch)
    ids = tok("def add(a, b):\n    return a + b\n\ndef add(a, b):", return_tensors="pt").input_ids
    ref = ENGINES["native"](model, ids, 20, exact, Sampling(), tok.pad_token_id).new_token_ids
    for name, drafter in drafters(arch, model).items():
        for k in (1, 4):
            fresh = drafters(arch, model)[name]
            gen, stats = generate(model, fresh, ids, 20, exact, k)
            assert gen.new_token_ids == ref, (name, k)
            assert len(gen.token_times) == gen.new_tokens and gen.token_times == sorted(gen.token_times)
            if name == "same":
                assert stats.acceptance_rate == 1.0 and stats.steps < gen.new_tokens


def test_prompt_lookup_finds_the_latest_ngram():
    lookup = PromptLookup(max_ngram=2)
    assert lookup.propose([1, 2, 3, 4, 1, 2], 3) == [3, 4, 1]
    assert lookup.propose([5, 6, 7], 3) == []
    assert lookup.propose([1, 2, 9, 1, 2, 8, 1, 2], 1) == [8]
