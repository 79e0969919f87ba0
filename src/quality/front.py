"""The speed–quality front: the configurations no other beats on both time per token and quality.

Both figures are "lower is better" here (time per token; KL divergence, Δ perplexity); a figure where
higher is better (accuracy) is negated by the caller.
"""

from __future__ import annotations

import math


def pareto(points: dict[str, tuple[float, float]]) -> set[str]:
    """The keys of the points (speed, quality) that no other point dominates (at least as good on both,
    better on one). A point with a NaN coordinate is never on the front."""
    finite = {k: p for k, p in points.items() if not any(math.isnan(v) for v in p)}

    def dominated(p: tuple[float, float]) -> bool:
        return any(q[0] <= p[0] and q[1] <= p[1] and q != p for q in finite.values())

    return {k for k, p in finite.items() if not dominated(p)}
