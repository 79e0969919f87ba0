"""Quantization in layer order, one decoder layer at a time: the one pass every method runs.

For each layer: its float weights are made (a model built hollow: read from a checkpoint, or filled at random) or
already there; one forward of the float layer over the calibration windows records what its linears' inputs hold
(SmoothQuant's max |x|, AWQ's sampled rows, GPTQ's X^T X); the method scales the layer (src.quant.methods); its
linears are rounded (by GPTQ where precision.gptq names them, against the Gram of their scaled inputs); the rounded
weights go in place of the float ones and the windows go on through the rounded layer to the next; the layer's
portable tensors are handed to a sink (memory, or a cache entry on disk written layer by layer: src.quant.shards)
and its float linears are dropped. So each layer's statistics are those the rounded layers before it pass on, as
the quantized model will meet them, and the memory held is the float model's parts outside the layers (embedding,
final norm, head), one layer in float, the calibration windows' hidden states (16 x 256 tokens of a 7B: 32 MB in
bf16, run through a layer in batches of windows: per_call) and one layer's Grams (a 7B's: three of 4096^2 and one
of 11008^2 in float32, 0.7 GB). Inside a layer the C heap keeps what it frees (src.common.heap.retained), so its temporaries reuse each other's pages rather than have the
kernel zero fresh ones; it is trimmed after each layer (kept across layers, a 7B's peak had grown to 11.7 GB, 19.3
under RTN: fragments no later layer reused).

The forwards' bf16 GEMMs run as this host's prefill runs them (`float_gemm`, measured per host: src.quant.prefill):
on a CPU without bf16 dot products (AVX2) as fp32 GEMMs of the same values, where ATen's bf16 GEMM ran at a few
GF/s and two 7B layers' forwards took ~560 s of their 857 (133 in all so).

With precision.calib_inputs=float, the windows go on as the float layer's forward left them: every layer is
calibrated on the float model's own states (as AutoAWQ's search is), in one forward a layer that runs every GEMM, where
the default (rounded) runs a second forward through the rounded weights.

A method that reads no data (RTN, no GPTQ) runs no forward at all: each layer is rounded from its weights alone.

Each layer is called on its own with the arguments the model's forward gives it (its attention mask and rotary
tables: Gemma 3 gives its sliding and global layers different ones), recorded by a forward of the model whose
layers pass their input on (`entry`): no layer's weights are needed for that, so a hollow model runs it.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Protocol

import torch
from torch import nn

from src.common import heap
from src.common.progress import progress
from src.common.schema import ConfigError
from src.kernels.modules import many_rows_mm
from src.models import families
from src.models.families import HEAD
from src.quant import formats, gptq
from src.quant.arch import decoder_layers, decoder_linears, layer_prefix, output_linear
from src.quant.weights import QuantizedWeights

log = logging.getLogger(__name__)

# Fills the named parameters, left on the meta device by a hollow build, with their float values.
Maker = Callable[[list[str]], None]


@dataclass
class Seen:
    """What one forward of a float layer met at its linears' inputs, per distinct input: `leader` maps each linear to
    the first linear that read its input (q, k and v read one; gate and up one), the other fields are by leader."""

    leader: dict[str, str] = field(default_factory=dict)
    absmax: dict[str, torch.Tensor] = field(default_factory=dict)  # per input channel, float32
    rows: dict[str, torch.Tensor] = field(default_factory=dict)  # sampled input rows (AWQ's), the model's dtype
    grams: dict[str, torch.Tensor] = field(default_factory=dict)  # X^T X, float32
    outputs: list[torch.Tensor] | None = None  # the float layer's outputs, where kept (calib_inputs=float)

    def of(self, kind: dict[str, torch.Tensor], name: str) -> torch.Tensor:
        return kind[self.leader[name]]


@dataclass
class Scaled:
    """A method's scaling of one layer: the float parameters it changed, clip ranges per linear, and the scale each
    linear's input was divided by (its Gram is rescaled by it: src.quant.stream._scaled_gram)."""

    changed: set[str] = field(default_factory=set)
    clips: dict[str, torch.Tensor] = field(default_factory=dict)
    divided: dict[str, torch.Tensor] = field(default_factory=dict)


@dataclass(frozen=True)
class Wants:
    """What a layer's forward must record for the method and GPTQ."""

    absmax: bool = False
    rows: torch.Tensor | None = None  # flat token positions of the windows to keep (AWQ's sample)
    grams: frozenset[str] = frozenset()  # linears rounded by GPTQ


class Sink(Protocol):
    """Where a quantization's layers go as they are rounded: `start` layers are there already (a resumed build),
    with `hidden`, the windows' states after them."""

    start: int
    hidden: list[torch.Tensor] | None

    def layer(self, index: int, tensors: dict, floats: dict, hidden: list[torch.Tensor] | None) -> None: ...

    def head(self, tensors: dict) -> None: ...

    def weights(self, format_of: dict[str, str], group_size: int | None, info: dict): ...


class Held:
    """A sink in memory (a quantization that no cache keeps: tests, the GPU benchmark)."""

    start = 0
    hidden = None

    def __init__(self):
        self.layers: dict[str, dict[str, torch.Tensor]] = {}
        self.floats: dict[str, torch.Tensor] = {}

    def layer(self, index, tensors, floats, hidden):
        self.layers.update(tensors)
        self.floats.update(floats)

    def head(self, tensors):
        self.layers.update(tensors)

    def weights(self, format_of, group_size, info):
        return QuantizedWeights(format_of, group_size, self.layers, self.floats, info)


def quantized_linears(model: nn.Module, arch: str, spec) -> dict[str, nn.Module]:
    """The linears a spec replaces: the decoder's, and the output head unless it stays float."""
    linears = decoder_linears(model, arch)
    if spec.quantize_head:
        linears[HEAD] = model.get_submodule(HEAD)
    return linears


def replaced_params(linears: dict[str, nn.Module]) -> set[str]:
    """The float parameters quantized `linears` (by name) replace: each one's weight, and its bias where it has one."""
    return {f"{name}.{p}" for name, m in linears.items() for p in ("weight", "bias") if getattr(m, p, None) is not None}


def gptq_linears(linears: dict[str, nn.Module], spec) -> set[str]:
    """The linears spec.gptq names (by name suffix; `*`: every one the precision quantizes), less the wide
    linears (spec.wide_linears, kept in a wider format) where spec.gptq_wide is false. A name that matches no
    linear the precision quantizes is refused."""
    unmatched = [s for s in spec.gptq if s != "*" and not any(name.endswith(s) for name in linears)]
    if unmatched:
        raise ConfigError(
            f"precision.gptq={list(spec.gptq)}: {', '.join(unmatched)} names no linear this precision quantizes; "
            f"use name suffixes such as {HEAD} (the output head), self_attn.v_proj, mlp.down_proj, or * for all"
        )
    named = {name for name in linears if "*" in spec.gptq or name.endswith(tuple(spec.gptq))}
    if spec.gptq_wide:
        return named
    return {name for name in named if not spec.is_wide(name)}


def release(linear: nn.Module) -> None:
    """Drop a float linear's weight (a tied head's stays with its embedding); `install` replaces the module. It
    goes to the meta device with its shape, as a hollow build leaves it: what a model holds is never read from
    what was dropped (random weights count every parameter's shape to give each its values: an empty one had
    shifted every layer made after it)."""
    weight = linear.weight
    linear.weight = nn.Parameter(torch.empty(weight.shape, dtype=weight.dtype, device="meta"), requires_grad=False)


def _materialize(model: nn.Module, names: list[str], make: Maker | None) -> None:
    missing = [n for n in names if model.get_parameter(n).device.type == "meta"]
    if not missing:
        return
    if make is None:
        raise RuntimeError(f"{missing[0]} was never made (a hollow model) and nothing can make it")
    make(missing)


def layer_hidden(out) -> torch.Tensor:
    """A decoder layer's output hidden states (some architectures return them in a tuple)."""
    return out[0] if isinstance(out, tuple) else out


CALL_TOKENS = 4096  # tokens a calibration forward takes at once (whole windows, as many as fit, in equal batches)


def per_call(windows: int, seq_len: int) -> int:
    """Windows a calibration forward takes at once: the most that fit CALL_TOKENS and divide `windows` evenly (one
    batch size, so every call meets the arguments the first was given). A 7B layer's GEMMs of 256 rows (a window a
    call) had run at under half the rate of one of 4096, each call copying the bf16 weights anew on the fp32 path."""
    most = max(1, min(windows, CALL_TOKENS // seq_len))
    return max(d for d in range(1, most + 1) if windows % d == 0)


@torch.no_grad()
def entry(model: nn.Module, layers: list[nn.Module], batches: torch.Tensor):
    """(layer 0's input for the windows, a batch of per_call windows a tensor; each layer's other arguments): the
    model's forward run over the batches with every layer replaced by one that records what it is given and passes
    its input on."""
    calls: list[tuple[tuple, dict] | None] = [None] * len(layers)
    inputs: list[torch.Tensor] = []

    def passing(i):
        def forward(*args, **kwargs):
            hidden = args[0] if args else kwargs.pop("hidden_states")
            if i == 0:
                inputs.append(hidden.detach().clone())
            if calls[i] is None:
                calls[i] = (args[1:], dict(kwargs))
            return hidden

        return forward

    for i, layer in enumerate(layers):
        layer.forward = passing(i)  # an instance attribute: nn.Module.__call__ calls it
    try:
        for rows in batches.split(per_call(*batches.shape)):
            model.model(input_ids=rows, use_cache=False)
    finally:
        for layer in layers:
            del layer.forward
    return inputs, calls


@torch.no_grad()
def observe(
    layer: nn.Module,
    linears: dict[str, nn.Module],
    hidden,
    args,
    kwargs,
    wants: Wants,
    last: str | None = None,
    outputs: bool = False,
) -> Seen:
    """One forward of the (float) layer over every window, recording at its linears' inputs what `wants` asks.
    Linears that read one input share one record (computed once, held once: GPTQ factors a shared Gram once).
    `last` (src.quant.arch.output_linear) names the linear whose output only the layer's output reads: this
    forward's output is not kept, so its input is recorded and its GEMM not run (zeros in its place: at 7B's
    shape a fifth of the layer's multiply-adds). `outputs`: the forward's outputs are kept instead (Seen.outputs),
    every GEMM run."""
    seen = Seen()
    by_id: dict[int, tuple[torch.Tensor, str]] = {}  # this window's inputs (held, so ids are not reused) -> leader
    offset = [0]  # the window's first flat token position
    gram_leaders: set[str] = set()
    inputs: dict[str, torch.Tensor] = {}  # by leader: the rows its Gram is formed from, every window's in one
    tokens = sum(h.shape[0] * h.shape[1] for h in hidden)

    def hook(name):
        def record(_module, a):
            x = a[0]
            first = by_id.setdefault(id(x), (x, name))[1]
            seen.leader.setdefault(name, first)
            if name in wants.grams:
                gram_leaders.add(first)
            if first != name:
                return
            rows = x.detach().reshape(-1, x.shape[-1])
            if wants.absmax:
                top = rows.abs().amax(dim=0).float()
                seen.absmax[name] = torch.maximum(seen.absmax[name], top) if name in seen.absmax else top
            if wants.rows is not None:
                lo = offset[0]
                keep = wants.rows[(wants.rows >= lo) & (wants.rows < lo + rows.shape[0])] - lo
                part = rows[keep].clone()
                seen.rows[name] = torch.cat([seen.rows[name], part]) if name in seen.rows else part
            # every window's rows of an input a GPTQ-rounded linear reads (which linears share one is known after
            # the first window), for one Gram over all of them: one GEMM writes it once, where a Gram a window had
            # written an 11008-wide matrix sixteen times; copied into place, where copies joined at the end had
            # been made twice
            if wants.grams and (offset[0] == 0 or name in gram_leaders):
                if offset[0] == 0:
                    inputs[name] = torch.empty(tokens, rows.shape[1], dtype=rows.dtype)
                inputs[name][offset[0] : offset[0] + rows.shape[0]].copy_(rows)

        return record

    handles = [m.register_forward_pre_hook(hook(name)) for name, m in linears.items()]
    skipped = linears.get(last)
    before = skipped.__dict__.get("forward") if skipped is not None else None  # its fp32 path (_gemms), kept
    if skipped is not None:  # an instance attribute: nn.Module.__call__ calls it, after the pre-hook
        width = skipped.out_features
        skipped.forward = lambda x: x.new_zeros(*x.shape[:-1], width)
    kept = [] if outputs else None
    try:
        for h in hidden:
            by_id.clear()
            out = layer(h, *args, **kwargs)
            if kept is not None:
                kept.append(layer_hidden(out))
            if offset[0] == 0:  # the inputs no GPTQ-rounded linear reads, known now: not kept
                for name in set(inputs) - gram_leaders:
                    del inputs[name]
            offset[0] += h.shape[0] * h.shape[1]
    finally:
        for handle in handles:
            handle.remove()
        if skipped is not None:
            del skipped.forward
            if before is not None:
                skipped.forward = before
    for name in gram_leaders:
        seen.grams[name] = gptq.gram(inputs.pop(name))
    seen.outputs = kept
    return seen


def _scaled_gram(seen: Seen, name: str, divided: dict[str, torch.Tensor], done: dict) -> torch.Tensor:
    """The Gram of `name`'s input after the scaling divided it by s: G / (s s^T), once per shared input (the same
    tensor for the linears that read it, so GPTQ factors it once). Divided in place, by rows then by columns: no
    other reads `seen`'s Gram, and the outer product s s^T and a new quotient had been two more 11008-wide
    matrices (1.7 s of two 7B layers' 92)."""
    leader = seen.leader[name]
    if leader not in done:
        g, s = seen.grams[leader], divided.get(name)
        done[leader] = g if s is None else gptq.scaled_(g, s)
    return done[leader]


def head_inputs(model: nn.Module, arch: str, hidden: torch.Tensor) -> torch.Tensor:
    """What the decoder stack hands the head: the last layer's states through the final norm (and OPT's
    projection out), where the model has them."""
    family = families.get(arch)
    for path in (family.final_norm, family.project_out):
        module = families.module_at(model, path)
        if module is not None:
            hidden = module(hidden)
    return hidden


def _fp32_forward(linear: nn.Module) -> Callable[[torch.Tensor], torch.Tensor]:
    """A bf16 linear's forward as prefill's "fp32" path runs it (src.kernels.modules.many_rows_mm): operands made
    fp32 exactly, one fp32 GEMM, the result rounded to bf16 as a bf16 GEMM rounds its fp32 sums."""

    def forward(x: torch.Tensor) -> torch.Tensor:
        y = many_rows_mm(x.reshape(-1, x.shape[-1]), linear.weight, "fp32")
        if linear.bias is not None:
            y = y + linear.bias
        return y.to(x.dtype).reshape(*x.shape[:-1], linear.out_features)

    return forward


@contextmanager
def _gemms(linears: dict[str, nn.Module], path: str):
    """Inside, the bf16 linears among `linears` multiply on `path` (src.kernels.modules.FLOAT_GEMMS): "fp32" where
    this host's bf16 GEMM is the slower (an AVX2 CPU's ran at a few GF/s, against ~140 in fp32: a 7B layer's
    calibration forwards had taken minutes)."""
    chosen = [m for m in linears.values() if path == "fp32" and m.weight.dtype == torch.bfloat16]
    for m in chosen:  # an instance attribute: nn.Module.__call__ calls it
        m.forward = _fp32_forward(m)
    try:
        yield
    finally:
        for m in chosen:
            del m.forward


def _sample(batches: torch.Tensor, tokens: int | None) -> torch.Tensor | None:
    """A fixed random subset of `tokens` flat positions of the windows (AWQ's search data)."""
    if tokens is None:
        return None
    order = torch.randperm(batches.numel(), generator=torch.Generator().manual_seed(0))
    return order[:tokens].sort().values


@torch.no_grad()
def quantize(
    model: nn.Module,
    arch: str,
    spec,
    calibration: torch.Tensor | None,
    make: Maker | None = None,
    sink: Sink | None = None,
    float_gemm: str = "bf16",
):
    """Quantize the model layer by layer into `sink` (memory where None) and return what the sink holds
    (QuantizedWeights). `make` makes the float weights a hollow model lacks, a layer at a time; each layer's
    quantized linears are dropped once rounded, the rest of it (its norms, scaled) kept for `install`. The
    calibration forwards' bf16 linears multiply on `float_gemm`'s path (the host's choice: src.quant.prefill)."""
    start_s = time.perf_counter()
    sink = sink if sink is not None else Held()
    linears = quantized_linears(model, arch, spec)
    format_of = {name: spec.format_for(name) for name in linears}
    chosen = gptq_linears(linears, spec)
    calibrating = calibration is not None and spec.calibrates
    through_float = calibrating and spec.calib_inputs == "float"
    second_forward = calibrating and not through_float  # the windows go on through the rounded layer
    layers = decoder_layers(model, arch)
    hidden, calls = entry(model, layers, calibration) if calibrating else (None, None)
    if sink.start:
        hidden = sink.hidden
        log.info("quantization resumed at layer %d of %d", sink.start + 1, len(layers))
    for i in range(sink.start):  # layers a killed build wrote: only what their quantized linears leave (the norms)
        prefix = layer_prefix(arch, i)
        replaced = replaced_params({name: m for name, m in linears.items() if name.startswith(prefix)})
        _materialize(model, [prefix + n for n, _ in layers[i].named_parameters() if prefix + n not in replaced], make)
    wants = Wants(absmax=spec.OBSERVES_ABSMAX, rows=_sample(calibration, spec.search_tokens()) if calibrating else None)
    clipped: list[str] = []

    def rounded(name: str, gram: torch.Tensor | None, clip: torch.Tensor | None) -> dict[str, torch.Tensor]:
        lin = linears[name]
        return formats.get(format_of[name]).tensors(lin.weight.detach(), lin.bias, spec.group_size, clip, gram)

    bar = progress(range(sink.start, len(layers)), "quantizing layers", total=len(layers) - sink.start)
    # inside a layer its large temporaries reuse each other's pages; trimmed after each (src.common.heap)
    with heap.retained():
        for i in bar:
            layer, prefix = layers[i], layer_prefix(arch, i)
            _materialize(model, [prefix + n for n, _ in layer.named_parameters()], make)
            mine = {name: m for name, m in linears.items() if name.startswith(prefix)}
            seen = Seen()
            if calibrating:
                want = Wants(wants.absmax, wants.rows, frozenset(n for n in mine if n in chosen))
                # the float layer's outputs go on (calib_inputs=float): its one forward runs every GEMM
                last = None if through_float else output_linear(arch, i)
                with _gemms(mine, float_gemm):
                    seen = observe(layer, mine, hidden, *calls[i], want, last=last, outputs=through_float)
            scaled = spec.scale_layer(model, arch, i, mine, seen) if calibrating else Scaled()
            clipped += sorted(scaled.clips)
            grams: dict[str, torch.Tensor] = {}
            tensors = {}
            for name, m in mine.items():
                gram = _scaled_gram(seen, name, scaled.divided, grams) if name in chosen else None
                tensors[name] = rounded(name, gram, scaled.clips.get(name))
                if second_forward:  # the layers after it meet its rounded weights, as the quantized model has them
                    fmt = formats.get(format_of[name])
                    m.weight.data = fmt.rounded_weight(tensors[name], spec.group_size, m.weight.dtype)
            gptq.forget()  # the layer's factors: the next layer's inputs are others
            if through_float:
                hidden = seen.outputs
            del seen, grams
            if second_forward:
                with _gemms(mine, float_gemm):
                    hidden = [layer_hidden(layer(h, *calls[i][0], **calls[i][1])) for h in hidden]
            floats = {
                p: model.get_parameter(p).detach().clone() for p in sorted(scaled.changed - replaced_params(mine))
            }
            sink.layer(i, tensors, floats, hidden)
            for m in mine.values():
                release(m)
            del tensors, floats
            heap.trim()  # the layer's float weights, statistics and copies, freed: handed back before the next is made
            done = i + 1 - sink.start
            left = (time.perf_counter() - start_s) / done * (len(layers) - i - 1)
            log.info("quantized layer %d of %d (about %.0f s left)", i + 1, len(layers), left)
    if HEAD in linears:
        _materialize(model, [f"{HEAD}.weight"], make)
        gram = None
        if HEAD in chosen:
            for h in hidden:
                x = head_inputs(model, arch, h)
                g = gptq.gram(x.reshape(-1, x.shape[-1]))
                gram = g if gram is None else gram + g
        sink.head({HEAD: rounded(HEAD, gram, None)})
        gptq.forget()
        release(linears[HEAD])
        heap.trim()
    info = {"quantize_s": time.perf_counter() - start_s, "layers": len(linears), "clipped": clipped}
    return sink.weights(format_of, spec.group_size, info)
