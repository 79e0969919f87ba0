"""SmoothQuant (Xiao et al., 2023): move activation outliers into the weights before int8.

s_j = max|X_j|^alpha / max|W_j|^(1 - alpha), per input channel j, folded into the preceding norm and
the following linears. alpha is per model (0.5 for OPT and 0.85 for Llama-2, as published).
"""

from __future__ import annotations

import torch

from src.quant import scaling
from src.quant.arch import ScaleGroup
from src.quant.stream import Scaled, Seen


def smoothing_scales(act_absmax: torch.Tensor, weights: list[torch.Tensor], alpha: float) -> torch.Tensor:
    w_absmax = torch.stack([w.abs().amax(dim=0) for w in weights]).amax(dim=0).float()
    s = act_absmax.clamp(min=1e-5).pow(alpha) / w_absmax.clamp(min=1e-5).pow(1 - alpha)
    return s.clamp(min=1e-5)


@torch.no_grad()
def smooth_layer(groups: list[ScaleGroup], seen: Seen, alpha: float) -> Scaled:
    """Smooth one layer's norm -> linears groups in place, by the max |x| its forward met (src.quant.stream)."""
    scaled = Scaled()
    for g in groups:
        s = smoothing_scales(seen.of(seen.absmax, g.names[0]), [lin.weight for lin in g.linears], alpha)
        scaled.changed.update(scaling.apply(g, s))
        scaled.divided.update({name: s for name in g.names})
    return scaled
