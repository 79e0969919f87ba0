"""SmoothQuant (Xiao et al., 2023): move activation outliers into the weights before int8.

s_j = max|X_j|^alpha / max|W_j|^(1 - alpha), per input channel j, folded into the preceding norm and
the following linears. alpha is per model (0.5 for OPT and 0.85 for Llama-2, as published).
"""

from __future__ import annotations

import torch
from torch import nn

from src.quant import calibrate, scaling
from src.quant.arch import smooth_groups


def smoothing_scales(act_absmax: torch.Tensor, weights: list[torch.Tensor], alpha: float) -> torch.Tensor:
    w_absmax = torch.stack([w.abs().amax(dim=0) for w in weights]).amax(dim=0).float()
    s = act_absmax.clamp(min=1e-5).pow(alpha) / w_absmax.clamp(min=1e-5).pow(1 - alpha)
    return s.clamp(min=1e-5)


@torch.no_grad()
def smooth(model: nn.Module, arch: str, batches: torch.Tensor, alpha: float) -> set[str]:
    """Smooth every norm -> linears group in place. Returns the float parameters it changed."""
    groups = smooth_groups(model, arch)
    stats = calibrate.input_absmax(model, {g.names[0]: g.linears[0] for g in groups}, batches)
    changed: set[str] = set()
    for g in groups:
        s = smoothing_scales(stats[g.names[0]], [lin.weight for lin in g.linears], alpha)
        changed.update(scaling.apply(g, s))
    return changed
