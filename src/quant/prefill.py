"""How linears multiply many rows (a prefill, a perplexity window), chosen per host by measuring: w8a8's int8
GEMM, and the GEMM of every 16-bit float linear (bf16 weights, and the weight-only formats' unpacked weights).

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

A bf16 GEMM of many rows (bf16 weights, w8a16's and the grouped formats' unpacked weights) has two paths too
(src.kernels.modules.many_rows_mm): bf16, or both operands made fp32 (exactly) and one fp32 GEMM. A CPU without
bf16 dot products (AVX2) ran ATen's bf16 GEMM at a quarter to a sixth of its fp32 one's speed; one with them
(AVX512_BF16, AMX) has bf16 kernels of its own to win with. Both sum the same products in fp32. Measured and
cached alike (param executed.float_gemm), never assumed from the CPU's flags.
"""

from __future__ import annotations

import functools
import json
import platform
import statistics
import time
from collections.abc import Callable
from pathlib import Path

import torch

from src.common.locks import atomic_write_text, read_record
from src.kernels import amx
from src.kernels.modules import FLOAT_GEMMS, many_rows_mm
from src.quant import qparams

PATHS = ("int_mm", "float")  # on every host; "amx" too where src.kernels.amx is enabled
PROBE = (128, 1024, 2048)  # rows, K, N: a short prefill through a small model's linear
CACHE = "int8_gemm.json"
FLOAT_CACHE = "float_gemm.json"


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


def _in_turns(calls: dict[str, Callable[[], object]], repeats: int) -> dict[str, float]:
    """Seconds per call of each, the median of `repeats` rounds taken in turns, after one warm call each
    (oneDNN builds its kernel on first use)."""
    times: dict[str, list[float]] = {name: [] for name in calls}
    for call in calls.values():
        call()
    for _ in range(repeats):
        for name, call in calls.items():
            start = time.perf_counter()
            call()
            times[name].append(time.perf_counter() - start)
    return {name: statistics.median(t) for name, t in times.items()}


def measure(repeats: int = 5) -> dict[str, float]:
    """Seconds per call of each int8 path on the probe (quantizing x included)."""
    m, k, n = PROBE
    g = torch.Generator().manual_seed(0)
    x = torch.randn(m, k, generator=g)
    w = torch.randint(-127, 128, (n, k), dtype=torch.int8, generator=g)
    w_scale = torch.rand(n, generator=g) / 100
    return _in_turns({p: functools.partial(gemm, x, w, w_scale, p) for p in paths()}, repeats)


def measure_float(repeats: int = 5) -> dict[str, float]:
    """Seconds per call of each bf16 GEMM path on the probe (making the weight fp32 included)."""
    m, k, n = PROBE
    g = torch.Generator().manual_seed(0)
    x = torch.randn(m, k, generator=g).bfloat16()
    w = torch.randn(n, k, generator=g).bfloat16()
    return _in_turns({p: functools.partial(many_rows_mm, x, w, p) for p in FLOAT_GEMMS}, repeats)


def _whole(entry, candidates: tuple[str, ...]) -> bool:
    """A cached measurement as a measure function writes it: a positive, finite time for every candidate."""
    return (
        isinstance(entry, dict)
        and set(entry) == set(candidates)
        and all(isinstance(v, (int, float)) and 0 < v < float("inf") for v in entry.values())
    )


def _host_key(cpu_model: str, threads: int, candidates: tuple[str, ...]) -> str:
    return (
        f"{cpu_model}|{platform.node()}|threads={threads}|torch={torch.__version__}|"
        f"aten={torch.backends.cpu.get_cpu_capability()}|onednn={torch.backends.mkldnn.is_available() and torch.backends.mkldnn.enabled}"
        f"|paths={','.join(candidates)}"
    )


def _cached_choice(path: Path, key: str, candidates: tuple[str, ...], measure_fn) -> tuple[str, dict[str, float]]:
    known = read_record(path) or {}  # a damaged cache is measured again, not trusted
    if not _whole(known.get(key), candidates):
        known[key] = measure_fn()
        path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write_text(path, json.dumps(known, indent=2))
    seconds = known[key]
    return min(seconds, key=seconds.get), seconds


def choose(cache_dir: Path, cpu_model: str, threads: int) -> tuple[str, dict[str, float]]:
    """w8a8's faster path on this host (measured once per CPU, thread count, torch and ATen ISA; cached)."""
    key = _host_key(cpu_model, threads, paths())
    return _cached_choice(Path(cache_dir) / CACHE, key, paths(), measure)


def choose_float(cache_dir: Path, cpu_model: str, threads: int) -> tuple[str, dict[str, float]]:
    """The faster bf16 GEMM path on this host (FLOAT_GEMMS), measured and cached as `choose`'s."""
    key = _host_key(cpu_model, threads, FLOAT_GEMMS)
    return _cached_choice(Path(cache_dir) / FLOAT_CACHE, key, FLOAT_GEMMS, measure_float)


def bf16_gemm_linears(model: torch.nn.Module) -> list[torch.nn.Module]:
    """The modules whose many-row calls are a bf16 GEMM (their `float_gemm` says which path runs it)."""
    return [m for m in model.modules() if hasattr(m, "float_gemm") and m.bf16_gemm]


def install_float_gemm(model: torch.nn.Module, path: str) -> int:
    """Set every bf16 GEMM's path; returns how many."""
    linears = bf16_gemm_linears(model)
    for module in linears:
        module.float_gemm = path
    return len(linears)
