"""What speculative decoding should gain, from what was measured (Leviathan et al. 2023, section 3).

With each proposal kept independently with probability alpha, k proposals per step, and a draft
forward costing c target forwards, a step yields (1 - alpha^(k+1)) / (1 - alpha) tokens for the price
of k*c + 1 target forwards, so the expected speedup over plain decoding is their ratio. Set beside the
measured speedup it shows whether a pair pays, and why: acceptance too low, or a draft too costly.
"""

from __future__ import annotations

import math


def tokens_per_step(alpha: float, k: float) -> float:
    if alpha >= 1.0:
        return k + 1.0
    return (1.0 - alpha ** (k + 1.0)) / (1.0 - alpha)


def expected_speedup(alpha: float, k: float, c: float) -> float:
    if any(math.isnan(v) for v in (alpha, k, c)):
        return math.nan
    return tokens_per_step(alpha, k) / (k * c + 1.0)


def alpha_from_accepted(mean_accepted: float, k: float) -> float:
    """The alpha under which k proposals keep `mean_accepted` of them per step on average (the
    measured acceptance rate alone mixes up a long run kept with many short ones)."""
    if math.isnan(mean_accepted) or k <= 0:
        return math.nan
    target = min(max(mean_accepted, 0.0), k)
    lo, hi = 0.0, 1.0
    for _ in range(60):  # kept per step = tokens_per_step - 1, increasing in alpha: bisect
        mid = (lo + hi) / 2
        if tokens_per_step(mid, k) - 1.0 < target:
            lo = mid
        else:
            hi = mid
    return (lo + hi) / 2
