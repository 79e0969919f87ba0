"""The memory-bandwidth roofline of a decode step, and how close a measured step comes to it.

A decode step of a small batch must read every weight it multiplies by once, plus the KV cache; on
a CPU that read, not the arithmetic, bounds it. So: roofline time/token = bytes per step / the host's
read bandwidth, and decode_efficiency = roofline time/token / measured time/token (1.0 = at the bound).

The bandwidth is probed beside the timing, after each example, not once per host: on a shared host
the memory a job gets moves within minutes (43-84 GB/s read on this project's 2-core EPYC within one
hour), so a bandwidth from another time would rate the same step anywhere from 0.7 to 1.3. On the CPU the
probe reads what the step reads, in place: the step's own weight tensors (`step_reads`), the largest first, up
to PROBE_MB of them, on the job's threads, so it meets the same pages (a cached model's mapped from its file)
and holds no buffer of its own (a 256 MiB one had put a cached 7B job's peak memory over its bound, and at 7B
read a fifteenth of the step's bytes). It repeats its passes until the best stops rising, so one probe's figure
holds still; the passes' spread is kept beside it. On a GPU the probe is a device-to-device copy timed by CUDA
events (its read + write bytes, as copy bandwidth is quoted).
"""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Callable

import torch
from torch import nn

from src import kernels
from src.common.metrics import Row, median

PROBE_MB = 1024  # the most a CPU probe reads: far beyond the last-level caches seen here (32-105 MB)
MIN_PROBE_MB = 4
DEVICE_PROBE_MB = 1024  # a GPU's copy: far beyond its L2 (50-60 MB on an H100/H200)
PROBE_REPEATS = 3  # passes at least
MAX_PASSES = 12  # and at most: a probe that never settles says so in its spread
STILL = 0.02  # settled: the best rose by less than this over the last pass
READ_ROW = 2048  # bf16 values per row of the kernel reader's matrix: 4 KB rows, as a 2048-wide layer's


def probe_mb(model: nn.Module) -> int:
    """The probe's size for this model: what its step reads, within [MIN_PROBE_MB, PROBE_MB] (a step smaller
    than the caches reads from them, and so does its probe; at Llama-2-7B's shape a quarter of its 3.8 GB)."""
    return int(min(max(weight_bytes(model) / 2**20, MIN_PROBE_MB), PROBE_MB))


class Probe:
    """Bandwidth in GB/s, measured now: each reader's best pass over the bytes it reads, passes repeated
    (readers in turns) until the best stops rising, taking the fastest reader; `spreads` keeps each call's
    spread (its best pass over its median pass, less one). On the CPU the bytes are `reads` (the step's
    tensors, read in place: `step_reads`), or else a buffer of `mb` made and kept; the readers are torch's max
    over them as bytes (integer: whatever the bytes hold) and, where quantspec's kernels are loaded, their own
    bf16 matrix-vector product over the same bytes (the step's kernels' loads and prefetch order, on the job's
    threads): on an Intel Xeon torch's sum read 25 GB/s where the kernel read 30-32, so a probe of the sum
    alone rated steps above 1.0. On CUDA: a device copy timed by events."""

    def __init__(
        self,
        threads: int,
        mb: int = PROBE_MB,
        repeats: int = PROBE_REPEATS,
        device: str = "cpu",
        reads: list[torch.Tensor] | None = None,
    ):
        self.threads, self.mb, self.repeats, self.device = threads, mb, repeats, torch.device(device)
        self.reads = reads if self.device.type == "cpu" else None
        self._buffer: torch.Tensor | None = None  # a GPU's, or a CPU's where no tensors are given
        self._bytes: list[torch.Tensor] | None = None  # what a CPU pass reads: uint8 views
        self.spreads: list[float] = []

    def bytes_read(self) -> int:
        """Bytes one pass of a reader reads."""
        return sum(b.numel() for b in self._bytes) if self._bytes is not None else self._buffer.numel() * 4

    def readers(self) -> dict[str, Callable[[], float]]:
        """Each way of reading the bytes once, by name: a call returns (seconds, bytes moved)."""
        if self.device.type == "cuda":
            x = self._buffer
            copy = torch.empty_like(x)
            return {"cuda copy": lambda: _events(lambda: copy.copy_(x), 2 * x.numel() * 4)}
        runs, moved = self._bytes, self.bytes_read()
        found = {"torch.amax": lambda: _timed(lambda: [b.amax() for b in runs], moved)}
        if kernels.loaded():
            # whole 4 KB rows of each run, as bf16 (read, never used: any bits will do)
            rows = [
                b[: b.numel() // (2 * READ_ROW) * 2 * READ_ROW].view(torch.bfloat16).view(-1, READ_ROW) for b in runs
            ]
            rows = [r for r in rows if r.shape[0]]
            vector = torch.ones(1, READ_ROW, dtype=torch.bfloat16)
            found["quantspec gemv"] = lambda: _timed(
                lambda: [torch.ops.quantspec.gemv_float(vector, r) for r in rows], sum(r.numel() * 2 for r in rows)
            )
        return found

    def _prepare(self) -> None:
        if self.reads is not None:
            self._bytes = _byte_runs(self.reads, self.mb * 2**20)
            return
        values = self.mb * 2**20 // 4 // READ_ROW * READ_ROW
        self._buffer = torch.ones(values, dtype=torch.float32, device=self.device)  # touched: pages resident
        if self.device.type == "cpu":
            self._bytes = [self._buffer.view(torch.uint8)]

    def rates(self) -> dict[str, float]:
        """GB/s of each reader, its best pass, passes until every reader's best settles (STILL)."""
        previous = torch.get_num_threads()
        torch.set_num_threads(self.threads)
        try:
            if self._buffer is None and self._bytes is None:
                self._prepare()
            readers = self.readers()
            passes: dict[str, list[float]] = {name: [] for name in readers}
            for count in range(1, MAX_PASSES + 1):
                before = {name: max(r, default=0.0) for name, r in passes.items()}
                for name, read in readers.items():
                    seconds, moved = read()
                    passes[name].append(moved / seconds / 1e9)
                settled = all(max(r) <= before[name] * (1 + STILL) for name, r in passes.items())
                if count >= self.repeats and settled:
                    break
            best = {name: max(r) for name, r in passes.items()}
            top = max(best, key=best.get)
            self.spreads.append(best[top] / statistics.median(passes[top]) - 1)
            return best
        finally:
            torch.set_num_threads(previous)

    def __call__(self) -> float:
        return max(self.rates().values())


def step_reads(model: nn.Module) -> list[torch.Tensor]:
    """The CPU tensors a decode step reads (every module's own, but an embedding's, of which a step reads one row;
    a tied head's through the head), each storage once (a fused projection's whole tensor, not its parts' views),
    largest first: what the probe reads in place. Tensors the step does not read are left alone: reading a mapped
    file's other pages would make them resident."""
    by_storage: dict[int, torch.Tensor] = {}
    for module in model.modules():
        if isinstance(module, nn.Embedding):
            continue
        for t in (*module.parameters(recurse=False), *module.buffers(recurse=False)):
            if t.device.type != "cpu" or not t.is_contiguous() or t.numel() == 0:
                continue
            key = t.untyped_storage().data_ptr()
            if key not in by_storage or t.nbytes > by_storage[key].nbytes:
                by_storage[key] = t
    return sorted(by_storage.values(), key=lambda t: -t.nbytes)


def _byte_runs(tensors: list[torch.Tensor], most: int) -> list[torch.Tensor]:
    """`tensors` in order as flat uint8 views, until `most` bytes are taken (the last one whole)."""
    runs, taken = [], 0
    for t in tensors:
        if taken >= most:
            break
        runs.append(t.detach().reshape(-1).view(torch.uint8))
        taken += runs[-1].numel()
    return runs


def _timed(read: Callable[[], object], moved: int) -> tuple[float, int]:
    start = time.perf_counter()
    read()
    return time.perf_counter() - start, moved


def _events(work: Callable[[], object], moved: int) -> tuple[float, int]:
    """A GPU's time for `work`, by CUDA events around it on the current stream."""
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    work()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) / 1e3, moved


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


def held_bytes(model: nn.Module) -> int:
    """Bytes the model's tensors hold as loaded (quantized ones as packed): each storage once, so a head tied
    to the embedding, or a fused projection's parts (views of it), count once."""
    seen, total = set(), 0
    for t in (*model.parameters(), *model.buffers()):
        if t.device.type == "meta":
            continue
        key = (t.untyped_storage().data_ptr(), t.device.type)
        if key not in seen:
            seen.add(key)
            total += t.untyped_storage().nbytes()
    return total


def memory_figures(model: nn.Module, rows: list[Row]) -> dict[str, float]:
    """weights_gb (the tensors as held) and kv_cache_gb (keys and values at the job's longest context, in the
    model's float dtype, sliding layers capped at their window), in GB (2**30 bytes)."""
    longest = max((r.prompt_tokens + r.new_tokens for r in rows), default=0)
    element = next(model.parameters()).element_size()
    return {"weights_gb": held_bytes(model) / 2**30, "kv_cache_gb": kv_bytes(model.config, longest, element) / 2**30}


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
