"""The uncertainty of each quality figure: standard errors, bootstrap intervals (scipy's), Wilson intervals
of shares, and Δ perplexity's standard error by the delta method, which no library gives.

Tokens are treated as independent draws, as llama.cpp's `llama-perplexity` does for its ± figures; tokens
of one window are correlated, so these intervals are, if anything, narrow.
"""

from __future__ import annotations

import math
import warnings

import numpy as np

BOOTSTRAP = 1000  # resamples: a 95% interval's ends move by well under its width from one seed to the next
SEED = 0  # fixed: the same scores give the same interval
BCA_MAX = 20_000  # values per sample up to which an interval is BCa (its jackknife is n evaluations of n - 1)


def scipy_stats():
    """scipy.stats, imported at the first interval drawn rather than with this module."""
    from scipy import stats  # ~0.5-0.8 s of a process's start, and most that import this module draw no interval

    return stats


def mean_se(values) -> tuple[float, float]:
    """The mean and its standard error (NaN for fewer than two values)."""
    x = np.asarray(values, dtype=np.float64)
    if x.size == 0:
        return math.nan, math.nan
    se = x.std(ddof=1) / math.sqrt(x.size) if x.size > 1 else math.nan
    return float(x.mean()), float(se)


def interval(samples: tuple, statistic, level: float = 0.95, iters: int = BOOTSTRAP) -> tuple[float, float]:
    """scipy's bootstrap interval of `statistic` over `samples` (each resampled on its own): BCa, which
    corrects the percentile interval's bias and skew, where it is defined and affordable, else the percentile
    interval (BCa's jackknife is undefined on too few or tied values, and its cost grows with n squared)."""
    sst = scipy_stats()
    methods = ("BCa", "percentile") if max(len(s) for s in samples) <= BCA_MAX else ("percentile",)
    for method in methods:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # a degenerate BCa is answered by the percentile interval below
            found = sst.bootstrap(
                samples,
                statistic,
                n_resamples=iters,
                confidence_level=level,
                method=method,
                vectorized=True,
                random_state=np.random.default_rng(SEED),
            ).confidence_interval
        if math.isfinite(found.low) and math.isfinite(found.high):
            return float(found.low), float(found.high)
    return math.nan, math.nan


def quantile_ci(values, q: float, level: float = 0.95, iters: int = BOOTSTRAP) -> tuple[float, float, float]:
    """The q-quantile with its bootstrap interval: (value, low, high)."""
    x = np.asarray(values, dtype=np.float64)
    low, high = interval((x,), lambda s, axis: np.quantile(s, q, axis=axis), level, iters)
    return float(np.quantile(x, q)), low, high


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


def proportion_ci(hits, level: float = 0.95) -> tuple[float, float, float]:
    """A share and its Wilson score interval (exact binomial counts; unlike p ± sqrt(p(1-p)/n), it does not
    shrink to nothing at 0 or 1): (share, low, high)."""
    x = np.asarray(hits, dtype=bool)
    if x.size == 0:
        return math.nan, math.nan, math.nan
    found = scipy_stats().binomtest(int(x.sum()), int(x.size)).proportion_ci(confidence_level=level, method="wilson")
    return float(x.mean()), float(found.low), float(found.high)


def median_ratio_ci(new, old, level: float = 0.95, iters: int = BOOTSTRAP * 2) -> tuple[float, float, float]:
    """median(new) / median(old) with its bootstrap interval, each side resampled on its own (two independent
    sets of measurements: rounds or examples of two sweeps): (ratio, low, high). With fewer than two values on
    a side the interval is NaN: one value has no spread to resample."""
    a, b = np.asarray(new, dtype=np.float64), np.asarray(old, dtype=np.float64)
    ratio = float(np.median(a) / np.median(b))
    if a.size < 2 or b.size < 2:
        return ratio, math.nan, math.nan
    low, high = interval((a, b), lambda x, y, axis: np.median(x, axis=axis) / np.median(y, axis=axis), level, iters)
    return ratio, low, high
