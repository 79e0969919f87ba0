"""Two jobs' per-example scores compared paired, so that "A is better than B" carries a p-value.

The same examples (tokens, items) were scored by both jobs: their differences example by example are far
less noisy than the two means apart (a hard item is hard for both).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from src.quality.stats import BOOTSTRAP, SEED, interval, scipy_stats


@dataclass
class Paired:
    test: str  # "paired permutation" or "McNemar (exact)"
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
    p = scipy_stats().binomtest(only_a, only_a + only_b).pvalue if only_a + only_b else 1.0
    return Paired("McNemar (exact)", int(a.size), float(a.mean() - b.mean()), math.nan, math.nan, float(p))


def means(a, b, iters: int = BOOTSTRAP * 2) -> Paired:
    """Per-example values (e.g. per-token KL) of two jobs on the same examples: the mean difference with its
    bootstrap 95% interval, and the two-sided p of a paired permutation test (each example's two values
    swapped at random: no smaller than 2/(iters + 1))."""
    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    if a.shape != b.shape:
        raise ValueError(f"paired scores need the same examples: {a.size} against {b.size}")
    d = a - b
    low, high = interval((d,), lambda x, axis: np.mean(x, axis=axis), 0.95, iters)
    tested = scipy_stats().permutation_test(
        (a, b),
        lambda x, y, axis: np.mean(x - y, axis=axis),
        permutation_type="samples",
        n_resamples=iters,
        vectorized=True,
        random_state=np.random.default_rng(SEED),
    )
    floor = 2 / (iters + 1)  # two-sided, no resample as far from 0 as the data: p is at most this
    return Paired(
        "paired permutation",
        int(d.size),
        float(d.mean()),
        low,
        high,
        float(tested.pvalue),
        bound=bool(tested.pvalue <= floor + 1e-12),
    )
