"""Quantize a float model (calibrate -> scale -> portable low-bit tensors), and install the result.

Two halves, so the cache sits between them: `quantize` produces `QuantizedWeights` (portable tensors,
what the cache stores); `install` swaps the runtime modules into a float model.
"""

from __future__ import annotations

import torch
from torch import nn

from src.common import heap
from src.quant import formats, stream
from src.quant.methods import HEAD, QuantSpec
from src.quant.stream import gptq_linears, quantized_linears, release
from src.quant.weights import QuantizedWeights

__all__ = [
    "QuantizedWeights",
    "gptq_linears",
    "install",
    "quantize",
    "quantized_linears",
    "release",
    "release_quantized",
]


def quantize(model: nn.Module, arch: str, spec: QuantSpec, calibration: torch.Tensor | None) -> QuantizedWeights:
    """Quantize a float model in memory, layer by layer (src.quant.stream). Mutates its float weights (scaling; each
    rounded layer's weights become their rounded values for the layers after it) and frees each quantized linear's
    float weight once its low-bit copy exists; `install` finishes the job."""
    return stream.quantize(model, arch, spec, calibration)


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
    for i, (name, tensors) in enumerate(weights.layers.items()):
        model.set_submodule(
            name, formats.build(weights.format_of[name], tensors, weights.group_size, dtype, gemv, device)
        )
        del tensors
        if i % 8 == 7:  # each linear's portable copy, freed once repacked: handed back as it goes (its peak)
            heap.trim()
    heap.trim()
    if HEAD in weights.layers:
        # The head had shared the embedding's weight (Gemma ties them); it now has its own, quantized.
        model.config.tie_word_embeddings = False
    return model


def quantized_bytes(weights: QuantizedWeights) -> int:
    sizes = getattr(weights.layers, "sizes", None)  # a cache's layers, read lazily, know their sizes unread
    if sizes is not None:
        return sum(sizes.values())
    return sum(t.numel() * t.element_size() for ts in weights.layers.values() for t in ts.values())
