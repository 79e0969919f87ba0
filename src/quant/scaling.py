"""Fold a per-channel scale s into a group: prev's output / s, the linears' input columns * s.

The float model computes the same function afterwards (up to rounding); only the distribution of
magnitudes between activations and weights moves, which is what makes them easier to quantize.
"""

from __future__ import annotations

import torch
from torch import nn

from src.quant.arch import ScaleGroup, is_gemma_norm


@torch.no_grad()
def divide_output(prev: nn.Module, s: torch.Tensor) -> None:
    if isinstance(prev, nn.Linear):
        prev.weight.div_(s[:, None].to(prev.weight.dtype))
    elif is_gemma_norm(prev):
        # Gemma's norm multiplies by (1 + w): (1 + w') = (1 + w) / s.
        prev.weight.copy_((1 + prev.weight.float()) / s - 1)
    else:  # RMSNorm (weight) or LayerNorm (weight and bias)
        prev.weight.div_(s.to(prev.weight.dtype))
    if getattr(prev, "bias", None) is not None:
        prev.bias.div_(s.to(prev.bias.dtype))


@torch.no_grad()
def apply(group: ScaleGroup, s: torch.Tensor) -> list[str]:
    """Fold s into the group. Returns the names of the float parameters it changed (for the cache)."""
    divide_output(group.prev, s)
    for lin in group.linears:
        lin.weight.mul_(s[None, :].to(lin.weight.dtype))
    changed = [f"{group.prev_name}.weight"] + (
        [f"{group.prev_name}.bias"] if getattr(group.prev, "bias", None) is not None else []
    )
    return changed + [f"{n}.weight" for n in group.names]
