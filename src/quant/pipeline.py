"""Quantize a float model (calibrate -> scale -> portable low-bit tensors), and install the result.

Two halves, so the cache sits between them: `quantize` produces `QuantizedWeights` (portable tensors,
what the cache stores); `install` swaps the runtime modules into a float model.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass, field

import torch
from torch import nn

from src.common.schema import ConfigError
from src.quant import schemes as formats
from src.quant.arch import decoder_linears
from src.quant.calibrate import input_grams
from src.quant.methods import HEAD, QuantSpec
from src.quant.sequential import round_layers


@dataclass
class QuantizedWeights:
    schemes: dict[str, str]  # linear name -> the scheme it runs (w8a8, ...)
    group_size: int | None
    layers: Mapping[str, dict[str, torch.Tensor]]  # linear name -> portable tensors (a cache's: read as asked)
    floats: dict[str, torch.Tensor]  # float parameters the scaling changed
    info: dict = field(default_factory=dict)


@torch.no_grad()
def quantize(model: nn.Module, arch: str, spec: QuantSpec, calibration: torch.Tensor) -> QuantizedWeights:
    """Quantize a float model. Mutates its float weights (scaling; where GPTQ rounds decoder linears, each rounded
    layer's weights become their rounded values for the layers after it) and frees each quantized linear's float
    weight once its low-bit copy exists; `install` finishes the job."""
    start = time.perf_counter()
    changed, clips = spec.scale(model, arch, calibration)  # the method's own pass (src.quant.methods)
    linears = quantized_linears(model, arch, spec)
    schemes = {name: spec.scheme_for(name) for name in linears}
    chosen = gptq_linears(linears, spec)

    def rounded(name: str, gram: torch.Tensor | None) -> dict[str, torch.Tensor]:
        lin = linears[name]
        return formats.get(schemes[name]).tensors(lin.weight.detach(), lin.bias, spec.group_size, clips.get(name), gram)

    layers = {}
    if chosen - {HEAD}:  # the decoder in layer order, each layer's GPTQ inputs through the layers rounded before it
        decoder = {name: lin for name, lin in linears.items() if name != HEAD}
        layers = round_layers(
            model,
            arch,
            decoder,
            chosen,
            rounded,
            lambda name, t: formats.get(schemes[name]).dequantized(t, spec.group_size),
            calibration,
        )
    # the head's: the decoder stack's output, through the rounded decoder where it was rounded in order
    grams = input_grams(model, {}, calibration, head=True) if HEAD in chosen else {}
    for name, lin in linears.items():
        if name not in layers:
            layers[name] = rounded(name, grams.pop("head", None) if name == HEAD else None)
        release(lin)  # its low-bit copy exists: freeing the float one keeps the peak at the float model's size
    quantized_params = {f"{name}.{p}" for name in layers for p in ("weight", "bias")}
    floats = {name: model.get_parameter(name).detach().clone() for name in sorted(changed - quantized_params)}
    return QuantizedWeights(
        schemes, spec.group_size, layers, floats, {"quantize_s": time.perf_counter() - start, "layers": len(layers)}
    )


def gptq_linears(linears: dict[str, nn.Module], spec: QuantSpec) -> set[str]:
    """The linears spec.gptq names (by name suffix; `*`: every one the precision quantizes). A name that matches
    no linear the precision quantizes is refused."""
    if "*" in spec.gptq:
        return set(linears)
    unmatched = [s for s in spec.gptq if not any(name.endswith(s) for name in linears)]
    if unmatched:
        raise ConfigError(
            f"precision.gptq={list(spec.gptq)}: {', '.join(unmatched)} names no linear this precision quantizes; "
            f"use name suffixes such as {HEAD} (the output head), self_attn.v_proj, mlp.down_proj, or * for all"
        )
    return {name for name in linears if name.endswith(spec.gptq)} if spec.gptq else set()


def release(linear: nn.Module) -> None:
    """Drop a float linear's weight (a tied head's stays with its embedding); `install` replaces the module."""
    linear.weight = nn.Parameter(torch.empty(0, dtype=linear.weight.dtype), requires_grad=False)


def quantized_linears(model: nn.Module, arch: str, spec: QuantSpec) -> dict[str, nn.Module]:
    """The linears a spec replaces: the decoder's, and the output head unless it stays float."""
    linears = decoder_linears(model, arch)
    if spec.quantize_head:
        linears[HEAD] = model.get_submodule(HEAD)
    return linears


def release_quantized(model: nn.Module, arch: str, spec: QuantSpec) -> None:
    """Free every float linear the spec's quantized weights replace (before they are read from a cache)."""
    for linear in quantized_linears(model, arch, spec).values():
        release(linear)


@torch.no_grad()
def install(
    model: nn.Module, weights: QuantizedWeights, dtype: torch.dtype, gemv: bool = False, device: str = "cpu"
) -> nn.Module:
    """Copy the scaled float parameters in and swap each linear for its runtime module (with quantspec's
    few-row kernels where `gemv`: they must be loaded), built on `device` (its kernels' layouts made there).
    Cast first."""
    for name, value in weights.floats.items():
        model.get_parameter(name).copy_(value)
    for name, tensors in weights.layers.items():
        model.set_submodule(
            name, formats.build(weights.schemes[name], tensors, weights.group_size, dtype, gemv, device)
        )
    if HEAD in weights.layers:
        # The head had shared the embedding's weight (Gemma ties them); it now has its own, quantized.
        model.config.tie_word_embeddings = False
    return model


def quantized_bytes(weights: QuantizedWeights) -> int:
    sizes = getattr(weights.layers, "sizes", None)  # a cache's layers, read lazily, know their sizes unread
    if sizes is not None:
        return sum(sizes.values())
    return sum(t.numel() * t.element_size() for ts in weights.layers.values() for t in ts.values())
