"""How a w8a8 linear multiplies many rows (a prefill, a perplexity window), chosen per host by measuring.

Every path quantizes x per token to the same int8 values, multiplies them by the int8 weight and applies the
same two scales in the same order:
  int_mm  ATen's int8 GEMM (torch._int_mm): exact int32 sums. Fast where oneDNN runs it (3-5x an fp32 GEMM
          here, AVX-512 or ATen held to AVX2); a plain loop without oneDNN (8x slower than fp32 here).
  float   one fp32 GEMM of the int8 values (exact in fp32, as are their products); sums are rounded as
          fp32 only past 2^24, far beyond a typical dot product's magnitude. Costs the weight's fp32 copy
          per call.
  amx     quantspec's GEMM on AMX's tiles (src/kernels/core/amx.cpp, where the CPU has them and Linux grants
          them): x quantized in the same pass, exact int32 sums, the result bit for bit int_mm's.
So no path is right everywhere: each host times both once on a probe shape, in turns, and the faster is
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
from src.kernels import amx
from src.quant import qparams

PATHS = ("int_mm", "float")  # on every host; "amx" too where src.kernels.amx is enabled
PROBE = (128, 1024, 2048)  # rows, K, N: a short prefill through a small model's linear
CACHE = "int8_gemm.json"


def paths() -> tuple[str, ...]:
    """The paths this process can run."""
    return PATHS + (("amx",) if amx.enabled() else ())


def int8_gemm(x_q: torch.Tensor, w_q: torch.Tensor, path: str) -> torch.Tensor:
    """x_q int8 [M, K] @ w_q int8 [N, K].T as float32 [M, N] (integer-valued): int_mm or float."""
    if path == "float":
        return torch.mm(x_q.float(), w_q.float().t())
    return torch._int_mm(x_q, w_q.t()).float()


def gemm(x: torch.Tensor, w_q: torch.Tensor, w_scale: torch.Tensor, path: str) -> torch.Tensor:
    """x [M, K] quantized per token to int8, times w_q int8 [N, K].T, scaled by x's and w's scales: float32
    [M, N], the same on every path. AMX steps through K in 64s: another K takes int_mm."""
    if path == "amx" and x.shape[1] % 64 == 0:
        return torch.ops.quantspec.int8_gemm_amx(x, w_q, w_scale)
    x_q, x_scale = qparams.int8_per_token(x)
    return int8_gemm(x_q, w_q, "int_mm" if path == "amx" else path).mul_(x_scale).mul_(w_scale)


def measure(repeats: int = 5) -> dict[str, float]:
    """Seconds per call of each path on the probe (quantizing x included), the median of `repeats` rounds
    taken in turns."""
    m, k, n = PROBE
    g = torch.Generator().manual_seed(0)
    x = torch.randn(m, k, generator=g)
    w = torch.randint(-127, 128, (n, k), dtype=torch.int8, generator=g)
    w_scale = torch.rand(n, generator=g) / 100
    times: dict[str, list[float]] = {p: [] for p in paths()}
    for path in times:
        gemm(x, w, w_scale, path)  # warm: oneDNN builds its kernel on first use
    for _ in range(repeats):
        for path in times:
            start = time.perf_counter()
            gemm(x, w, w_scale, path)
            times[path].append(time.perf_counter() - start)
    return {p: statistics.median(t) for p, t in times.items()}


def _whole(entry) -> bool:
    """A cached measurement as measure() writes it: a positive, finite time for every path this process runs."""
    return (
        isinstance(entry, dict)
        and set(entry) == set(paths())
        and all(isinstance(v, (int, float)) and 0 < v < float("inf") for v in entry.values())
    )


def choose(cache_dir: Path, cpu_model: str, threads: int) -> tuple[str, dict[str, float]]:
    """The faster path on this host (measured once per CPU, thread count, torch and ATen ISA; cached)."""
    path = Path(cache_dir) / CACHE
    key = (
        f"{cpu_model}|{platform.node()}|threads={threads}|torch={torch.__version__}|"
        f"aten={torch.backends.cpu.get_cpu_capability()}|onednn={torch.backends.mkldnn.is_available() and torch.backends.mkldnn.enabled}"
        f"|paths={','.join(paths())}"
    )
    known = read_record(path) or {}  # a damaged cache is measured again, not trusted
    if not _whole(known.get(key)):
        known[key] = measure()
        path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write_text(path, json.dumps(known, indent=2))
    seconds = known[key]
    return min(seconds, key=seconds.get), seconds
