"""Two jobs' per-example scores compared paired, so that "A is better than B" carries a p-value.

The same examples (tokens, items) were scored by both jobs: their differences example by example are far
less noisy than the two means apart (a hard item is hard for both).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from src.quality.stats import BOOTSTRAP, SEED


@dataclass
class Paired:
    test: str  # "paired bootstrap" or "McNemar (exact)"
    n: int  # examples compared
    difference: float  # mean of a − b (for McNemar: accuracy a − accuracy b)
    low: float  # its 95% interval (NaN for McNemar)
    high: float
    p: float  # two-sided
    bound: bool = False  # p is only bounded (no resample crossed 0): it is at most this

    def p_text(self) -> str:
        return f"≤ {self.p:.2g}" if self.bound else f"{self.p:.2g}"


def mcnemar(a, b) -> Paired:
    """Per-item correctness (booleans) of two jobs on the same items: the exact McNemar test (a binomial test
    on the items where exactly one of them is right)."""
    a, b = np.asarray(a, dtype=bool), np.asarray(b, dtype=bool)
    if a.shape != b.shape:
        raise ValueError(f"paired scores need the same items: {a.size} against {b.size}")
    only_a, only_b = int((a & ~b).sum()), int((b & ~a).sum())
    m, low = only_a + only_b, min(only_a, only_b)
    p = 1.0 if m == 0 else min(1.0, 2 * sum(math.comb(m, i) for i in range(low + 1)) / 2**m)
    return Paired("McNemar (exact)", int(a.size), float(a.mean() - b.mean()), math.nan, math.nan, p)


def bootstrap(a, b, iters: int = BOOTSTRAP * 2) -> Paired:
    """Per-example values (e.g. per-token KL) of two jobs on the same examples: the mean difference with
    its paired-bootstrap 95% interval and two-sided p (the share of resampled differences on the other side
    of 0, doubled; no smaller than 1/iters)."""
    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    if a.shape != b.shape:
        raise ValueError(f"paired scores need the same examples: {a.size} against {b.size}")
    d = a - b
    rng = np.random.default_rng(SEED)
    draws = d[rng.integers(0, d.size, size=(iters, d.size))].mean(axis=1)
    lo, hi = np.quantile(draws, [0.025, 0.975])
    side = min((draws <= 0).mean(), (draws >= 0).mean())
    return Paired(
        "paired bootstrap",
        int(d.size),
        float(d.mean()),
        float(lo),
        float(hi),
        float(min(1.0, max(2 * side, 1 / iters))),
        bound=bool(side == 0),
    )
