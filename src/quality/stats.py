"""The uncertainty of each quality figure: standard errors, bootstrap intervals, Δ perplexity.

Tokens are treated as independent draws, as llama.cpp's `llama-perplexity` does for its ± figures; tokens
of one window are correlated, so these intervals are, if anything, narrow.
"""

from __future__ import annotations

import math

import numpy as np

BOOTSTRAP = 1000  # resamples: a 95% interval's ends move by well under its width from one seed to the next
SEED = 0  # fixed: the same scores give the same interval


def mean_se(values) -> tuple[float, float]:
    """The mean and its standard error (NaN for fewer than two values)."""
    x = np.asarray(values, dtype=np.float64)
    if x.size == 0:
        return math.nan, math.nan
    se = x.std(ddof=1) / math.sqrt(x.size) if x.size > 1 else math.nan
    return float(x.mean()), float(se)


def quantile_ci(values, q: float, level: float = 0.95, iters: int = BOOTSTRAP) -> tuple[float, float, float]:
    """The q-quantile with its percentile-bootstrap interval: (value, low, high)."""
    x = np.asarray(values, dtype=np.float64)
    rng = np.random.default_rng(SEED)
    draws = np.quantile(x[rng.integers(0, x.size, size=(iters, x.size))], q, axis=1)
    tail = (1 - level) / 2
    return float(np.quantile(x, q)), float(np.quantile(draws, tail)), float(np.quantile(draws, 1 - tail))


def perplexity_se(nll) -> tuple[float, float]:
    """exp(mean NLL) and its standard error by the delta method (d exp(m) = exp(m) dm)."""
    mean, se = mean_se(nll)
    ppl = math.exp(mean)
    return ppl, ppl * se


def delta_perplexity(nll, reference_nll) -> tuple[float, float]:
    """ppl − reference ppl over the same tokens, with its standard error: the delta method on the two
    means, with their covariance (the same tokens are hard for both, which narrows the difference's error)."""
    a, b = np.asarray(nll, dtype=np.float64), np.asarray(reference_nll, dtype=np.float64)
    n = a.size
    ea, eb = math.exp(a.mean()), math.exp(b.mean())
    if n < 2:
        return ea - eb, math.nan
    cov = np.cov(a, b, ddof=1) / n
    var = ea * ea * cov[0, 0] + eb * eb * cov[1, 1] - 2 * ea * eb * cov[0, 1]
    return ea - eb, math.sqrt(max(var, 0.0))


def proportion_se(hits) -> tuple[float, float]:
    """A share and its binomial standard error sqrt(p(1-p)/n)."""
    x = np.asarray(hits, dtype=np.float64)
    p = float(x.mean())
    return p, math.sqrt(p * (1 - p) / x.size)


def median_ratio_ci(new, old, level: float = 0.95, iters: int = BOOTSTRAP * 2) -> tuple[float, float, float]:
    """median(new) / median(old) with a percentile-bootstrap interval, each side resampled on its own (two
    independent sets of measurements: rounds or examples of two sweeps): (ratio, low, high). With fewer than
    two values on a side the interval is NaN: one value has no spread to resample."""
    a, b = np.asarray(new, dtype=np.float64), np.asarray(old, dtype=np.float64)
    ratio = float(np.median(a) / np.median(b))
    if a.size < 2 or b.size < 2:
        return ratio, math.nan, math.nan
    rng = np.random.default_rng(SEED)
    draws = np.median(a[rng.integers(0, a.size, size=(iters, a.size))], axis=1) / np.median(
        b[rng.integers(0, b.size, size=(iters, b.size))], axis=1
    )
    tail = (1 - level) / 2
    return ratio, float(np.quantile(draws, tail)), float(np.quantile(draws, 1 - tail))
