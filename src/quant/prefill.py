"""How a w8a8 linear multiplies many rows (a prefill, a perplexity window), chosen per host by measuring.

Both paths multiply the same int8 values and apply the same two scales:
  int_mm  ATen's int8 GEMM (torch._int_mm): exact int32 sums. Fast where oneDNN runs it (3-5x an fp32 GEMM
          here, AVX-512 or ATen held to AVX2); a plain loop without oneDNN (8x slower than fp32 here).
  float   one fp32 GEMM of the int8 values (exact in fp32, as are their products); sums are rounded as
          fp32 only past 2^24, far beyond a typical dot product's magnitude. Costs the weight's fp32 copy
          per call.
So neither is right everywhere: each host times both once on a probe shape, in turns, and the faster is
used and recorded (param executed.int8_gemm); the result is cached as JSON beside the roofline's probe.
"""

from __future__ import annotations

import json
import platform
import statistics
import time
from pathlib import Path

import torch

from src.common.locks import atomic_write_text, read_record

PATHS = ("int_mm", "float")
PROBE = (128, 1024, 2048)  # rows, K, N: a short prefill through a small model's linear
CACHE = "int8_gemm.json"


def int8_gemm(x_q: torch.Tensor, w_q: torch.Tensor, path: str) -> torch.Tensor:
    """x_q int8 [M, K] @ w_q int8 [N, K].T as float32 [M, N] (integer-valued)."""
    if path == "float":
        return torch.mm(x_q.float(), w_q.float().t())
    return torch._int_mm(x_q, w_q.t()).float()


def measure(repeats: int = 5) -> dict[str, float]:
    """Seconds per call of each path on the probe, the median of `repeats` rounds taken in turns."""
    m, k, n = PROBE
    g = torch.Generator().manual_seed(0)
    x = torch.randint(-127, 128, (m, k), dtype=torch.int8, generator=g)
    w = torch.randint(-127, 128, (n, k), dtype=torch.int8, generator=g)
    times: dict[str, list[float]] = {p: [] for p in PATHS}
    for path in PATHS:
        int8_gemm(x, w, path)  # warm: oneDNN builds its kernel on first use
    for _ in range(repeats):
        for path in PATHS:
            start = time.perf_counter()
            int8_gemm(x, w, path)
            times[path].append(time.perf_counter() - start)
    return {p: statistics.median(t) for p, t in times.items()}


def _whole(entry) -> bool:
    """A cached measurement as measure() writes it: a positive, finite time for every path."""
    return (
        isinstance(entry, dict)
        and set(entry) == set(PATHS)
        and all(isinstance(v, (int, float)) and 0 < v < float("inf") for v in entry.values())
    )


def choose(cache_dir: Path, cpu_model: str, threads: int) -> tuple[str, dict[str, float]]:
    """The faster path on this host (measured once per CPU, thread count, torch and ATen ISA; cached)."""
    path = Path(cache_dir) / CACHE
    key = (
        f"{cpu_model}|{platform.node()}|threads={threads}|torch={torch.__version__}|"
        f"aten={torch.backends.cpu.get_cpu_capability()}|onednn={torch.backends.mkldnn.is_available() and torch.backends.mkldnn.enabled}"
    )
    known = read_record(path) or {}  # a damaged cache is measured again, not trusted
    if not _whole(known.get(key)):
        known[key] = measure()
        path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write_text(path, json.dumps(known, indent=2))
    seconds = known[key]
    return min(seconds, key=seconds.get), seconds
