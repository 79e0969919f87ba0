"""The seeded draw every sampling engine takes its tokens from (src.engine.generation.draw)."""

import torch

from src.engine.generation import draw


def test_draws_follow_the_distribution_and_never_take_a_zero_weight_entry():
    probs = torch.tensor([0.1, 0.0, 0.6, 0.3, 0.0])
    generator = torch.Generator().manual_seed(0)
    counts = torch.bincount(torch.tensor([draw(probs, generator) for _ in range(20000)]), minlength=5)
    assert counts[1] == 0 and counts[4] == 0
    share = counts.double() / counts.sum()
    assert torch.allclose(share, probs.double(), atol=0.015)


def test_a_seed_gives_the_same_draws():
    probs = torch.softmax(torch.randn(1000, generator=torch.Generator().manual_seed(1)), -1)
    first = [draw(probs, torch.Generator().manual_seed(7)) for _ in range(3)]
    assert first == [draw(probs, torch.Generator().manual_seed(7)) for _ in range(3)]
