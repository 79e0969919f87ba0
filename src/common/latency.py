"""Every token's time, beside the seed table's medians: each timed example's time to its first token (TTFT), the
gap before each later token (inter-token latency, ITL) and their mean (time per output token, TPOT, the seed
table's Time/Token), summarized as percentiles, their mean and their maximum, as vLLM's `bench` and
optimum-benchmark report them.

What a percentile is over: TTFT and TPOT, one value per example; ITL, every gap of every example (a draft's
accepted tokens arrive together: gaps of 0, as a streaming client sees them). The times are the kept run's
(the run of median total time, where an example was timed more than once), in milliseconds. Percentiles
interpolate linearly between the two nearest ranks (numpy's default), so p99 of ten values lies between the
ninth and the tenth.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass

import numpy as np

PERCENTILES = (50, 90, 99)
FIGURES = ("ttft_ms", "tpot_ms", "itl_ms")
STATS = (*(f"p{p}" for p in PERCENTILES), "mean", "max")
ARTIFACT = "token_times.jsonl"


@dataclass(frozen=True)
class TokenTimes:
    example: int
    ttft_ms: float
    itl_ms: tuple[float, ...]  # the gap before each new token after the first

    @property
    def tpot_ms(self) -> float:
        return sum(self.itl_ms) / len(self.itl_ms) if self.itl_ms else math.nan

    def as_dict(self) -> dict:
        # microseconds are below any timer's noise here: the file stays small at thousands of tokens
        return {
            "example": self.example,
            "ttft_ms": round(self.ttft_ms, 3),
            "itl_ms": [round(g, 3) for g in self.itl_ms],
        }


def token_times(example: int, start: float, times: list[float]) -> TokenTimes:
    """From a generation's perf_counter readings: its start and the moment each new token existed."""
    if not times:
        raise ValueError("a generation with no new token has no token times")
    gaps = tuple((b - a) * 1000 for a, b in zip(times, times[1:]))
    return TokenTimes(example, (times[0] - start) * 1000, gaps)


def stats(name: str, values: list[float]) -> dict[str, float]:
    """`<name>_p50`, `_p90`, `_p99`, `_mean`, `_max` over the finite values; none where there are none."""
    finite = np.array([v for v in values if math.isfinite(v)], dtype=np.float64)
    if not finite.size:
        return {}
    found = {f"{name}_p{p}": float(np.percentile(finite, p)) for p in PERCENTILES}
    return {**found, f"{name}_mean": float(finite.mean()), f"{name}_max": float(finite.max())}


def summary(examples: list[TokenTimes]) -> dict[str, float]:
    """The job's TTFT, TPOT and ITL statistics (FIGURES x STATS)."""
    return {
        **stats("ttft_ms", [e.ttft_ms for e in examples]),
        **stats("tpot_ms", [e.tpot_ms for e in examples]),
        **stats("itl_ms", [g for e in examples for g in e.itl_ms]),
    }


def jsonl(examples: list[TokenTimes]) -> str:
    """The artifact: one line per example, every gap kept (what the summary's percentiles were taken over)."""
    return "".join(json.dumps(e.as_dict()) + "\n" for e in examples)
