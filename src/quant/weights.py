"""A model's quantized weights as the cache stores them: each linear's format and portable tensors, and the float
parameters the scaling changed. What a quantization produces (src.quant.stream) and `install` reads
(src.quant.pipeline)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

import torch


@dataclass
class QuantizedWeights:
    format_of: dict[str, str]  # linear name -> the format it runs (w8a8, ...)
    group_size: int | None
    layers: Mapping[str, dict[str, torch.Tensor]]  # linear name -> portable tensors (a cache's: read as asked)
    floats: dict[str, torch.Tensor]  # float parameters the scaling changed
    info: dict = field(default_factory=dict)
