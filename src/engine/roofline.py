"""The memory-bandwidth roofline of a decode step, and how close a measured step comes to it.

A decode step of a small batch must read every weight it multiplies by once, plus the KV cache; on
a CPU that read, not the arithmetic, bounds it. So: roofline time/token = bytes per step / the host's
read bandwidth, and decode_efficiency = roofline time/token / measured time/token (1.0 = at the bound).

The bandwidth is probed beside the timing, after each example, not once per host: on a shared host
the memory a job gets moves within minutes (43-84 GB/s read on this project's 2-core EPYC within one
hour), so a bandwidth from another time would rate the same step anywhere from 0.7 to 1.3.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable

import torch
from torch import nn

from src import kernels
from src.common.metrics import Row, median

PROBE_MB = 256  # several times the last-level caches seen here (32-105 MB), so the probe reads DRAM
PROBE_REPEATS = 3
READ_ROW = 2048  # bf16 values per row of the kernel reader's matrix: 4 KB rows, as a 2048-wide layer's


class Probe:
    """Read bandwidth in GB/s, measured now: the best of a few passes over one buffer by each reader, taking
    the fastest reader. The readers are torch's sum and, where quantspec's kernels are loaded, their own
    bf16 matrix-vector product over the same bytes (the step's kernels' loads and prefetch order, on the
    job's threads): on an Intel Xeon torch's sum read 25 GB/s where the kernel read 30-32, so a probe of the
    sum alone rated steps above 1.0. The buffer is touched once, when first measured, and kept."""

    def __init__(self, threads: int, mb: int = PROBE_MB, repeats: int = PROBE_REPEATS):
        self.threads, self.mb, self.repeats = threads, mb, repeats
        self._buffer: torch.Tensor | None = None

    def readers(self) -> dict[str, Callable[[], object]]:
        """Each way of reading the whole buffer once, by name."""
        x = self._buffer
        found = {"torch.sum": x.sum}
        if kernels.loaded():
            rows = x.view(torch.bfloat16).view(-1, READ_ROW)  # 1.0f's halves are bf16 0 and 1: no NaN, no Inf
            vector = torch.ones(1, READ_ROW, dtype=torch.bfloat16)
            found["quantspec gemv"] = lambda: torch.ops.quantspec.gemv_float(vector, rows)
        return found

    def rates(self) -> dict[str, float]:
        """GB/s of each reader, the best of `repeats` passes, readers in turns."""
        previous = torch.get_num_threads()
        torch.set_num_threads(self.threads)
        try:
            if self._buffer is None:
                self._buffer = torch.ones(self.mb * 2**20 // 4, dtype=torch.float32)  # touched: pages resident
            readers = self.readers()
            best = dict.fromkeys(readers, math.inf)
            for _ in range(self.repeats):
                for name, read in readers.items():
                    start = time.perf_counter()
                    read()
                    best[name] = min(best[name], time.perf_counter() - start)
            return {name: self._buffer.numel() * 4 / seconds / 1e9 for name, seconds in best.items()}
        finally:
            torch.set_num_threads(previous)

    def __call__(self) -> float:
        return max(self.rates().values())


def _buffer_bytes(module: nn.Module) -> int:
    return sum(
        t.numel() * t.element_size() for t in (*module.parameters(recurse=False), *module.buffers(recurse=False))
    )


def weight_bytes(model: nn.Module) -> int:
    """Bytes one decode step reads from the weights: every module's own tensors, except that an
    embedding lookup reads one row (a tied head still reads the whole matrix, as a linear)."""
    total = 0
    for module in model.modules():
        if isinstance(module, nn.Embedding):
            total += module.weight.shape[1] * module.weight.element_size()
            total += sum(b.numel() * b.element_size() for b in module.buffers(recurse=False))
        elif hasattr(module, "step_bytes"):  # quantized modules: the layout their kernel path reads
            total += module.step_bytes()
        else:
            total += _buffer_bytes(module)
    return total


def kv_bytes(config, context: int, element_size: int) -> int:
    """Bytes of keys and values one step reads at this context length (sliding layers cap it)."""
    cfg = config.get_text_config() if hasattr(config, "get_text_config") else config
    heads = getattr(cfg, "num_key_value_heads", None) or cfg.num_attention_heads
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    types = getattr(cfg, "layer_types", None) or ["full_attention"] * cfg.num_hidden_layers
    window = getattr(cfg, "sliding_window", None) or context
    positions = sum(min(context, window) if t == "sliding_attention" else context for t in types)
    return 2 * heads * head_dim * positions * element_size


def roofline_ms(model: nn.Module, context: int, bandwidth_gbs: float) -> float:
    element = next(model.parameters()).element_size()
    return (weight_bytes(model) + kv_bytes(model.config, context, element)) / (bandwidth_gbs * 1e9) * 1000


def efficiency(model: nn.Module, rows: list[Row], bandwidths: list[float]) -> tuple[list[float], dict[str, float]]:
    """Per example and in summary: roofline time/token at the example's mean context and the bandwidth
    probed beside it, over measured. An example whose step read faster than the probe (the probe is then
    no ceiling) is rated against the step's own rate, 1.0, and counted in `bandwidth_probe_short`: the
    figure never passes 1, and the shortfall is reported, not hidden."""
    if len(bandwidths) != len(rows):
        raise ValueError(f"{len(rows)} examples but {len(bandwidths)} bandwidth probes")
    ideal = [roofline_ms(model, r.prompt_tokens + r.new_tokens // 2, b) for r, b in zip(rows, bandwidths)]
    raw = [i / r.time_per_token_ms if r.time_per_token_ms > 0 else math.nan for i, r in zip(ideal, rows)]
    short = [e for e in raw if e > 1.0]
    rated = [min(e, 1.0) for e in raw]  # min keeps a NaN (it compares false), as a step with no time has
    summary = {
        "decode_efficiency_median": median(rated),
        "roofline_ms_median": median(ideal),
        "bandwidth_gbs": median(bandwidths),
        "step_weight_mb": weight_bytes(model) / 2**20,
        "bandwidth_probe_short": float(len(short)),
    }
    if short:
        summary["bandwidth_probe_short_max"] = max(short)  # the step's rate over the probe's, at worst
    return rated, summary
