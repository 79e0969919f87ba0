"""Linears that read one input (q/k/v, gate/up) in as few kernel calls as their formats allow.

A decode step on a small model is short of work per call: Gemma 3 270M's q, k and v projections are
0.1-0.7 MB each, and every call pays the same fixed costs (the dispatcher, quantizing x, splitting the
rows across threads). Fused, their weights are one tensor, x is quantized once and the threads split one
longer N. Each output column is computed exactly as before (its own weight row and the same x; the parts
meet at multiples of 4, the kernels' blocking), so the logits are bit for bit those of separate calls.

The parts keep working on their own (transformers' forward for a prefill calls them one by one): their
weights become views of the fused tensors, so nothing is held twice.
"""

from __future__ import annotations

import copy

import torch
from torch import nn

from src.common import heap
from src.kernels.modules import GemvLinear
from src.quant import formats
from src.quant.linear import GroupedGemv

# The tensors of each gemv module class that stack along output channels (dim 0): each format's (its ROWS).
ROWS = {GemvLinear: ("weight",), **formats.fusable_rows()}
# Plain float linears fuse too where a step asks (src.engine.static_step: on a GPU one launch instead of three);
# the Python step path keeps them apart, as measured.
PLAIN = {nn.Linear: ("weight",)}
ALIGN = 64  # bytes: ATen's int8 kernel needs its weight 64-byte aligned (src.quant.linear._owned)


def _fusable(parts: list[nn.Module], rows: dict) -> bool:
    cls = type(parts[0])
    if cls not in rows or any(type(p) is not cls for p in parts) or len(parts) < 2:
        return False
    if len({p.in_features for p in parts}) != 1 or len({p.bias is None for p in parts}) != 1:
        return False
    if issubclass(cls, GroupedGemv) and len({p.group for p in parts}) != 1:
        return False
    # Each part must start where the kernels' blocks of 4 do, and its views stay aligned.
    offsets = [sum(p.out_features for p in parts[:i]) for i in range(len(parts))]
    matrices = [getattr(parts[0], name) for name in rows[cls] if getattr(parts[0], name).dim() == 2]
    return all(o % 4 == 0 for o in offsets) and all(
        o * m.stride(0) * m.element_size() % ALIGN == 0 for m in matrices for o in offsets
    )


def fuse(parts: list[nn.Module], rows: dict = ROWS) -> nn.Module | None:
    """One module computing the parts' outputs side by side, or None where they cannot share a call.
    The parts' tensors become views of the fused module's. `rows`: the classes that may fuse."""
    if not _fusable(parts, rows):
        return None
    fused = copy.copy(parts[0])
    fused._parameters, fused._buffers = dict(fused._parameters), dict(fused._buffers)
    fused.out_features = sum(p.out_features for p in parts)
    names = rows[type(parts[0])] + (("bias",) if parts[0].bias is not None else ())
    for name in names:
        whole = torch.cat([getattr(p, name).detach() for p in parts])
        setattr(
            fused,
            name,
            nn.Parameter(whole, requires_grad=False) if isinstance(getattr(parts[0], name), nn.Parameter) else whole,
        )
        start = 0
        for p in parts:
            view = whole[start : start + p.out_features]
            setattr(
                p, name, nn.Parameter(view, requires_grad=False) if isinstance(getattr(p, name), nn.Parameter) else view
            )
            start += p.out_features
    heap.trim()  # the parts' own tensors, freed: handed back now, or every layer's would be held twice at the peak
    return fused


class Projection:
    """Linears over one input, called as one: consecutive parts that fuse share a kernel call (`plain`: float
    nn.Linears too)."""

    def __init__(self, linears: list[nn.Module], plain: bool = False):
        rows = {**ROWS, **PLAIN} if plain else ROWS
        self.calls: list[tuple[nn.Module, list[int]]] = []
        i = 0
        while i < len(linears):
            # the longest run from i that fuses (q/k/v together, or q/k with v apart under w4a16 and w4a8)
            for j in range(len(linears), i + 1, -1):
                fused = fuse(linears[i:j], rows)
                if fused is not None:
                    self.calls.append((fused, [p.out_features for p in linears[i:j]]))
                    i = j
                    break
            else:
                self.calls.append((linears[i], [linears[i].out_features]))
                i += 1

    def __call__(self, x: torch.Tensor) -> list[torch.Tensor]:
        outs: list[torch.Tensor] = []
        for module, sizes in self.calls:
            y = module.forward(x)
            outs.extend(y.split(sizes, dim=-1) if len(sizes) > 1 else (y,))
        return outs

    @property
    def kernel_calls(self) -> int:
        return len(self.calls)
