"""The weight formats a precision's linears run (precision.format, head_format), one entry each, registered
once: its weight and activation bits, whether it quantizes in groups, how its portable tensors are made
(what the cache stores) and which runtime module runs them, off quantspec's kernels and on them. Everything
else asks here: the methods' validation, the quantizer, the runtime modules' build, the C++ step (through
each module's step_call), the hardware profiles (they list formats), the docs.

Adding a format (docs/how-to/add-precision.md walks through w2a16): an entry here (its bits, its portable
tensors, its `aten` module and its `gemv` module in src/quant/linear.py, whose step_call is the C++ step's call and
ROWS what fuses along output channels); for quantspec's kernels, its name and bits in core/api.h's QS_FORMATS and a
reference kernel in core/reference.cpp (every other variant falls back to it until it has its own); a precision in
conf/precision/ that names it.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from src import kernels
from src.quant import gptq, linear, qparams

GROUPS = (32, 64, 128, 256)  # group sizes a grouped format takes (ATen's int4 kernel's; quantspec's: 128, 256)


@dataclass(frozen=True)
class Format:
    name: str  # weights x activations, as precision.format names it
    bits: int  # weight bits
    act_bits: int  # 16: weight-only (activations stay 16-bit); 8: activations rounded per token at run time
    aten: type[linear.QuantLinear]  # its module off quantspec's kernels (ATen's, or torch operators)
    gemv: type[linear.QuantLinear]  # its module on quantspec's kernels (a few rows; prefill as that module says)

    @property
    def grouped(self) -> bool:
        """Scales per group of input features (precision.group_size applies), not per output channel."""
        return self.bits < 8

    def tensors(
        self,
        weight: torch.Tensor,
        bias: torch.Tensor | None,
        group: int | None,
        clip: torch.Tensor | None = None,
        gram: torch.Tensor | None = None,
    ) -> dict[str, torch.Tensor]:
        """The portable tensors (safetensors in the cache) of one float linear in this format: rounded to
        nearest, or where `gram` (its calibration inputs' X^T X) is given, by GPTQ's error feedback."""
        if gram is not None:
            q, scale, zero = gptq.round_weights(weight, gram, self.bits, group if self.grouped else None, clip)
            return linear.packed_tensors(q, scale, zero, bias, self.bits)
        if self.grouped:
            return linear.grouped_tensors(weight, bias, group, self.bits, clip)
        return linear.int8_tensors(weight, bias)

    def rounded_weight(self, t: dict[str, torch.Tensor], group: int | None, dtype: torch.dtype) -> torch.Tensor:
        """The weight these portable tensors hold as a rounded linear multiplies by it in a prefill, in `dtype`:
        where quantspec's kernels are loaded and hold a bf16 grouped weight in their lane layout, unpacked by them
        (the gemv module's prefill, in one vectorized pass: torch's dequantizing passes had taken ~0.3-0.7 s of a
        7B layer's quantization); else dequantized() in `dtype`."""
        lanes = f"{qparams.LANES}{self.bits}"
        if self.grouped and dtype == torch.bfloat16 and lanes in t and kernels.loaded():
            return self.gemv.from_tensors(t, group, dtype).unpacked()
        return self.dequantized(t, group).to(dtype)

    def dequantized(self, t: dict[str, torch.Tensor], group: int | None) -> torch.Tensor:
        """The float [N, K] weight these portable tensors hold (what the rounded linear computes with)."""
        if self.grouped:
            q = qparams.stored_values(t, self.bits)
            return qparams.groups_dequant(q, t["scale"], t["zero"], group, self.bits)
        return t["w_q"].float() * t["w_scale"].float()[:, None]


FORMATS: dict[str, Format] = {}


def register(fmt: Format) -> Format:
    if fmt.name in FORMATS:
        raise ValueError(f"format {fmt.name!r} is registered twice")
    FORMATS[fmt.name] = fmt
    return fmt


register(Format("w8a8", 8, 8, linear.W8A8Linear, linear.W8A8Gemv))
register(Format("w8a16", 8, 16, linear.W8A16Linear, linear.W8A16Gemv))
register(Format("w4a16", 4, 16, linear.W4A16Linear, linear.W4A16Gemv))
register(Format("w4a8", 4, 8, linear.W4A8Linear, linear.W4A8Gemv))
register(Format("w2a16", 2, 16, linear.W2A16Linear, linear.W2A16Gemv))
register(Format("w6a16", 6, 16, linear.W6A16Linear, linear.W6A16Gemv))
register(Format("w5a16", 5, 16, linear.W5A16Linear, linear.W5A16Gemv))


def names() -> tuple[str, ...]:
    return tuple(FORMATS)


def grouped() -> tuple[str, ...]:
    return tuple(name for name, s in FORMATS.items() if s.grouped)


def get(name: str) -> Format:
    if name not in FORMATS:
        raise ValueError(f"unknown format {name!r}; known: {', '.join(FORMATS)}")
    return FORMATS[name]


def build(
    name: str,
    t: dict[str, torch.Tensor],
    group: int | None,
    dtype: torch.dtype,
    gemv: bool = False,
    device: str = "cpu",
) -> nn.Module:
    """The runtime module for these portable tensors: on ATen's kernels, or (gemv, where its K fits the
    kernel's step) with quantspec's for a few rows; off the CPU, on ATen's kernels for `device`, its layouts
    made there."""
    fmt = get(name)
    if device != "cpu":  # quantspec's kernels are CPU kernels
        t, gemv = {key: v.to(device) for key, v in t.items()}, False
    k = t["w_q"].shape[1] if "w_q" in t else qparams.packed_weights(t, fmt.bits)[0].shape[1] * 8 // fmt.bits
    step = fmt.gemv.K_STEP
    fits = k % step == 0 and (not fmt.grouped or group % step == 0)
    cls = fmt.gemv if gemv and fits else fmt.aten
    return cls.from_tensors(t, group, dtype)


def fusable_rows() -> dict[type, tuple[str, ...]]:
    """Each format's gemv module -> the tensors that stack along output channels (src.engine.fused)."""
    return {s.gemv: s.gemv.ROWS for s in FORMATS.values() if s.gemv.ROWS}
