"""Runtime linear modules in the gpt-fast manner: packed buffers, and one kernel call in `forward`.

Each is built from portable tensors (what the cache stores); kernel-specific layouts are made here,
at load, because they depend on the machine, except the gemv kernels' own lane layout of grouped weights, which
the cache stores (qparams.pack_weights) and those kernels read in place. Built on a CUDA device (`build(..., device="cuda")`), the
ATen modules take ATen's CUDA kernels from the same tensors (src.quant.aten_ops): a precision means the
same on every hardware.
"""

from __future__ import annotations

import torch
from torch import nn

from src.kernels import MAX_ROWS, format_number
from src.kernels.modules import many_rows_mm
from src.quant import aten_ops, qparams
from src.quant.prefill import gemm as w8a8_gemm


def _owned(t: torch.Tensor, dtype: torch.dtype | None = None) -> torch.Tensor:
    """A fresh copy in the allocator's (64-byte aligned) memory. Tensors loaded from safetensors are
    views at arbitrary offsets, and torch 2.13's _weight_int8pack_mm segfaults on an int8 weight that
    is not 64-byte aligned (found with a cached model: 4+ rows crashed, 1-3 did not)."""
    out = torch.empty(t.shape, dtype=dtype or t.dtype, device=t.device)
    return out.copy_(t)


def _flat(x: torch.Tensor) -> tuple[torch.Tensor, tuple[int, ...]]:
    return x.reshape(-1, x.shape[-1]), x.shape[:-1]


class QuantLinear(nn.Module):
    """A quantized linear on ATen's kernels. Its *Gemv subclass (below) adds quantspec's own kernel for
    calls of at most MAX_ROWS rows (decode steps, draft verification); which of the two a model gets is
    chosen once, when `build` makes it (src.quant.pipeline.install, gemv=True where src/kernels loaded)."""

    # The buffers a one-token step reads (a Gemv module also holds ATen's layout, for prefill: counting
    # every buffer would overstate the roofline).
    STEP_BUFFERS: tuple[str, ...] = ()
    # The tensors that stack along output channels, where src.engine.fused may join modules of this class
    # into one call (quantspec's kernels only); () for none.
    ROWS: tuple[str, ...] = ()
    # The weight's first dimension multiple of K its kernel steps through (quantspec's kernels; 1: any).
    K_STEP = 1

    @classmethod
    def from_tensors(cls, t: dict[str, torch.Tensor], group: int | None, dtype: torch.dtype) -> QuantLinear:
        """The module from its format's portable tensors (src.quant.formats)."""
        raise NotImplementedError

    def step_call(self, act: torch.dtype) -> tuple[int, list[torch.Tensor], int, bool] | None:
        """(format number, tensors, group, bf16 input) as step.cpp's Call runs it, or None where this module is
        not on quantspec's kernels (the C++ step then leaves the model to the Python step path)."""
        return None

    def __init__(self, in_features: int, out_features: int, bias: torch.Tensor | None):
        super().__init__()
        self.in_features, self.out_features = in_features, out_features
        self.register_buffer("bias", bias, persistent=False)

    def step_bytes(self) -> int:
        tensors = [getattr(self, n) for n in self.STEP_BUFFERS + ("bias",) if getattr(self, n, None) is not None]
        return sum(t.numel() * t.element_size() for t in tensors)

    def _finish(self, y: torch.Tensor, x: torch.Tensor, lead: tuple[int, ...]) -> torch.Tensor:
        if self.bias is not None:
            y = y + self.bias
        return y.to(x.dtype).reshape(*lead, self.out_features)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, bias={self.bias is not None}"


def _rows_bias(bias: torch.Tensor | None, ids: torch.Tensor) -> torch.Tensor | None:
    return None if bias is None else bias[ids]


class W8A8Linear(QuantLinear):
    """int8 weights per output channel x int8 activations per token, quantized at run time."""

    STEP_BUFFERS = ("w_q", "w_scale")
    prefill = "int_mm"  # the many-row path (src.quant.prefill: measured per host and set by the job)

    def __init__(self, w_q: torch.Tensor, w_scale: torch.Tensor, bias: torch.Tensor | None = None):
        super().__init__(w_q.shape[1], w_q.shape[0], bias)
        # Stored [N, K]; the kernel takes its transpose as a view (column-major B), no copy.
        self.register_buffer("w_q", _owned(w_q, torch.int8), persistent=False)
        self.register_buffer("w_scale", _owned(w_scale, torch.float32), persistent=False)

    @classmethod
    def from_tensors(cls, t, group, dtype):
        return cls(t["w_q"], t["w_scale"], t.get("bias"))

    def select_rows(self, ids: torch.Tensor) -> W8A8Linear:
        """These output channels only (a draft's cut-down head), on the same kernels."""
        return type(self)(self.w_q[ids], self.w_scale[ids], _rows_bias(self.bias, ids))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x2, lead = _flat(x)
        if x2.device.type != "cpu":  # the CPU's many-row paths (int_mm, float, AMX) are measured per host
            return self._finish(aten_ops.int8_matmul(x2, self.w_q, self.w_scale), x, lead)
        return self._finish(w8a8_gemm(x2, self.w_q, self.w_scale, self.prefill), x, lead)


class W8A16Linear(QuantLinear):
    """int8 weights per output channel, 16-bit activations: a weight-only int8 kernel."""

    STEP_BUFFERS = ("w_q", "w_scale")

    def __init__(
        self,
        w_q: torch.Tensor,
        w_scale: torch.Tensor,
        bias: torch.Tensor | None = None,
        dtype: torch.dtype = torch.bfloat16,
    ):
        super().__init__(w_q.shape[1], w_q.shape[0], None if bias is None else bias.to(dtype))
        self.register_buffer("w_q", _owned(w_q, torch.int8), persistent=False)
        self.register_buffer("w_scale", _owned(w_scale, dtype), persistent=False)  # ATen's kernel: x's dtype
        # The exact (float32) scale: a cut-down head is rebuilt from it, not from its rounding.
        self.register_buffer("w_scale32", _owned(w_scale, torch.float32), persistent=False)

    @classmethod
    def from_tensors(cls, t, group, dtype):
        return cls(t["w_q"], t["w_scale"], t.get("bias"), dtype=dtype)

    def select_rows(self, ids: torch.Tensor) -> W8A16Linear:
        """These output channels only (a draft's cut-down head), on the same kernels."""
        return type(self)(self.w_q[ids], self.w_scale32[ids], _rows_bias(self.bias, ids), dtype=self.w_scale.dtype)

    # From this many rows (a prefill) the weight made bf16 (exact: |q| <= 127) and one bf16 GEMM beat
    # ATen's int8 kernel, which scales with the rows: 4x at 512 rows of a 7B MLP linear here.
    GEMM_ROWS = 128
    float_gemm = "bf16"  # that GEMM in bf16, or made fp32 (src.kernels.modules.many_rows_mm; the host's choice)

    @property
    def bf16_gemm(self) -> bool:
        return self.w_scale.dtype == torch.bfloat16

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x2, lead = _flat(x)
        x2 = x2.to(self.w_scale.dtype)
        if x2.shape[0] >= self.GEMM_ROWS:
            if self.float_gemm == "fp32" and self.bf16_gemm:  # int8 weights are exact in fp32 as in bf16
                y = many_rows_mm(x2, self.w_q, "fp32").mul_(self.w_scale32)  # no bf16 copy of the weight
            else:
                y = torch.mm(x2, self.w_q.to(x2.dtype).t()) * self.w_scale
        else:
            y = aten_ops.int8_weight_matmul(x2, self.w_q, self.w_scale)
        return self._finish(y, x, lead)


class W4A16Linear(QuantLinear):
    """4-bit asymmetric weights in groups, bf16 activations: ATen's int4 kernel for the device the tensors are
    on (the CPU's, or CUDA's tinygemm)."""

    N_MULTIPLE = 16  # the kernel packs output channels in blocks of 16
    STEP_BUFFERS = ("packed", "scales_zeros")

    def __init__(
        self, q: torch.Tensor, scale: torch.Tensor, zero: torch.Tensor, group: int, bias: torch.Tensor | None = None
    ):
        """q: the [N, K] 4-bit values (unpacked: ATen's kernel packs them its own way)."""
        super().__init__(q.shape[1], q.shape[0], None if bias is None else bias.to(torch.bfloat16))
        self.group = group
        # Odd output sizes (a vocabulary of 32001) are padded with zero rows and sliced off after.
        pad = -q.shape[0] % self.N_MULTIPLE
        if pad:
            q = torch.cat([q, q.new_zeros(pad, q.shape[1])])
            scale, zero = (torch.cat([t, t.new_zeros(pad, t.shape[1])]) for t in (scale, zero))
        self.register_buffer("packed", aten_ops.pack_int4(q), persistent=False)
        # [N, K/g] scale and zero -> the kernel's [K/g, N, 2]
        sz = torch.stack([scale.t(), zero.t()], dim=-1).to(torch.bfloat16).contiguous()
        self.register_buffer("scales_zeros", sz, persistent=False)

    @classmethod
    def from_tensors(cls, t, group, dtype):
        return cls(qparams.stored_values(t, 4), t["scale"], t["zero"], group, t.get("bias"))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x2, lead = _flat(x)
        y = aten_ops.int4_weight_matmul(x2.to(torch.bfloat16).contiguous(), self.packed, self.group, self.scales_zeros)
        if y.shape[-1] != self.out_features:
            y = y[:, : self.out_features]
        return self._finish(y, x, lead)


class W4A8Linear(W4A16Linear):
    """4-bit weights as W4A16Linear's, activations rounded per token to int8 at the input (x / scale, exact in
    bf16) before ATen's int4 kernel, then scaled back: w4a8's arithmetic where quantspec's kernels are not built."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x2, lead = _flat(x)
        x_q, x_scale = qparams.int8_per_token(x2, torch.bfloat16)
        y = aten_ops.int4_weight_matmul(x_q, self.packed, self.group, self.scales_zeros)
        y = y[:, : self.out_features].float().mul_(x_scale)
        return self._finish(y, x, lead)


# --- the same, with quantspec's kernels for a few rows (src/kernels; prefill stays on ATen's) -------


class W8A8Gemv(W8A8Linear):
    K_STEP = 64  # the kernel steps through K in 64s
    STEP_BUFFERS = ("w_q", "w_scale", "w_sum")
    ROWS = STEP_BUFFERS

    def __init__(self, w_q: torch.Tensor, w_scale: torch.Tensor, bias: torch.Tensor | None = None):
        super().__init__(w_q, w_scale, bias)
        # Row sums undo the +128 that makes activations unsigned for VPDPBUSD.
        self.register_buffer("w_sum", self.w_q.sum(dim=1, dtype=torch.int32), persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x2, lead = _flat(x)
        if x2.shape[0] > MAX_ROWS:
            return super().forward(x)
        return self._finish(torch.ops.quantspec.gemv_w8a8(x2, self.w_q, self.w_scale, self.w_sum), x, lead)

    def step_call(self, act):
        return format_number("w8a8"), [self.w_q, self.w_scale, self.w_sum], 0, act == torch.bfloat16


class W8A16Gemv(W8A16Linear):
    K_STEP = 32
    STEP_BUFFERS = ("w_q", "w_scale32")
    ROWS = ("w_q", "w_scale", "w_scale32")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x2, lead = _flat(x)
        if x2.shape[0] > MAX_ROWS:
            return super().forward(x)
        return self._finish(torch.ops.quantspec.gemv_w8a16(x2, self.w_q, self.w_scale32), x, lead)

    def step_call(self, act):
        return format_number("w8a16"), [self.w_q, self.w_scale32], 0, act == torch.bfloat16


class GroupedGemv(QuantLinear):
    """A grouped weight-only format (w4a16, ...) on quantspec's kernels alone: the gemv for a few rows; for
    more (a prefill) the weight is unpacked to bf16 by the same kernels and multiplied in one bf16 GEMM. No
    copy in ATen's layout is kept (at 7B, for int4, that would be 3.4 GB more). A format is a subclass naming
    its kernels' format (core/api.h) and its bits."""

    FORMAT: str  # its name in core/api.h's QS_FORMATS (the kernels' number is read from there at build)
    UNPACK: str  # the format whose unpacking its prefill uses (its own, or w4a16's for w4a8's same nibbles)
    BITS: int
    K_STEP = 128  # 128 values per 16 * BITS bytes; groups must be whole multiples of it
    STEP_BUFFERS = ("wg", "wg_scale", "wg_offset")
    ROWS = STEP_BUFFERS
    float_gemm = "bf16"  # its prefill's GEMM in bf16, or the unpacked weight made fp32 (the host's choice)
    bf16_gemm = True
    # A prefill's x (precision.prefill_activations, set by the job: install_prefill_activations below):
    # bf16, against the weight unpacked to bf16; or int8 per block of 128 values, against the weight's own values
    # (core/api.h's gemm_grouped_x8: u8 x s8 dot products, about twice a bf16 GEMM's multiply-adds a cycle).
    prefill_activations = "bf16"

    def __init__(
        self, lanes: torch.Tensor, scale: torch.Tensor, zero: torch.Tensor, group: int, bias: torch.Tensor | None = None
    ):
        """lanes: the packed bytes in the kernels' lane layout (qparams.pack_lanes at BITS), as the cache stores
        them: kept as given, so a cached model's are read in place from its mapped file."""
        super().__init__(
            lanes.shape[1] * 8 // self.BITS, lanes.shape[0], None if bias is None else bias.to(torch.bfloat16)
        )
        self.group = group
        self.format, self.unpack = format_number(self.FORMAT), format_number(self.UNPACK)
        self.register_buffer("wg", lanes.contiguous(), persistent=False)
        # w = q * scale + offset, offset = zero - 2^(bits-1) * scale: the kernels' form of the zero point
        self.register_buffer("wg_scale", scale.float().contiguous(), persistent=False)
        offset = zero - (1 << (self.BITS - 1)) * scale
        self.register_buffer("wg_offset", offset.float().contiguous(), persistent=False)

    @classmethod
    def from_tensors(cls, t, group, dtype):
        return cls(t[f"{qparams.LANES}{cls.BITS}"], t["scale"], t["zero"], group, t.get("bias"))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x2, lead = _flat(x)
        x2 = x2.to(torch.bfloat16).contiguous()
        if x2.shape[0] > MAX_ROWS:
            return self._finish(self._prefill(x2), x, lead)
        y = torch.ops.quantspec.gemv_grouped(x2, self.wg, self.wg_scale, self.wg_offset, self.group, self.format)
        return self._finish(y, x, lead)

    def step_call(self, act):
        return self.format, [self.wg, self.wg_scale, self.wg_offset], self.group, True

    # The weight is unpacked a block of output channels at a time, ~8 MB of bf16: reused from the
    # allocator's free memory, where a whole 11008 x 4096 weight at once (90 MB of fresh pages) cost 28 ms,
    # 3x the GEMM at 128 rows; 22 MB blocks were as slow. Measured against ATen's int4 kernel on Llama-2-7B's
    # MLP shapes: 1.3x faster at 17 rows, 5x at 128, 7-10x at 512.
    PREFILL_BYTES = 8 << 20

    def unpacked(self) -> torch.Tensor:
        """The whole weight as its prefill multiplies it: bf16 [N, K], unpacked by the kernels."""
        return torch.ops.quantspec.dequant_grouped(self.wg, self.wg_scale, self.wg_offset, self.group, self.unpack)

    def _prefill(self, x2: torch.Tensor) -> torch.Tensor:
        """x2 (bf16) times the weight, a block of output channels at a time: bf16, or fp32 where `float_gemm`
        says (then the result is fp32); on int8 activations where `prefill_activations` says."""
        if self.prefill_activations == "int8":
            return self._prefill_x8(x2)
        fp32 = self.float_gemm == "fp32"
        xg = x2.float() if fp32 else x2
        y = xg.new_empty(x2.shape[0], self.out_features)
        block = max(64, self.PREFILL_BYTES // (2 * self.in_features) // 64 * 64)
        for n0 in range(0, self.out_features, block):
            n1 = min(n0 + block, self.out_features)
            w = torch.ops.quantspec.dequant_grouped(
                self.wg[n0:n1], self.wg_scale[n0:n1], self.wg_offset[n0:n1], self.group, self.unpack
            )
            torch.mm(xg, (w.float() if fp32 else w).t(), out=y[:, n0:n1])
        return y

    def _prefill_x8(self, x2: torch.Tensor) -> torch.Tensor:
        """x2 on int8 activations (core/api.h's gemm_grouped_x8), float32: the kernels' GEMM where the variant in use
        has one for this format; else the same int8 x times its block scales and the weight's values times theirs, in
        one fp32 GEMM per block of output channels (the same quantities, rounded in fp32 in another order)."""
        ops = torch.ops.quantspec
        if ops.has_gemm_grouped_x8(self.format):
            return ops.gemm_grouped_x8(x2, self.wg, self.wg_scale, self.wg_offset, self.group, self.format)
        q, xs, _ = ops.quantize_x8_blocks(x2)
        rows, k = q.shape
        xf = (q.view(rows, -1, 128).float() * xs.unsqueeze(-1)).view(rows, k)
        y = xf.new_empty(rows, self.out_features)
        block = max(64, self.PREFILL_BYTES // (4 * self.in_features) // 64 * 64)
        for n0 in range(0, self.out_features, block):
            n1 = min(n0 + block, self.out_features)
            values = qparams.unpack_weights(self.wg[n0:n1], self.BITS, True).float()
            w = (values.view(n1 - n0, -1, self.group) * self.wg_scale[n0:n1, :, None]).add_(
                self.wg_offset[n0:n1, :, None]
            )
            torch.mm(xf, w.view(n1 - n0, k).t(), out=y[:, n0:n1])
        return y


class W4A16Gemv(GroupedGemv):
    FORMAT = UNPACK = "w4a16"
    BITS = 4


class W2A16Gemv(GroupedGemv):
    """2-bit weights in groups (four a byte, a quarter of int8's bytes), 16-bit activations."""

    FORMAT = UNPACK = "w2a16"
    BITS = 2


class W6A16Gemv(GroupedGemv):
    """6-bit weights in groups (three quarters of int8's bytes), 16-bit activations: for the head and the linears
    a 4-bit precision keeps wider, where int8 spends more bytes than their quality needs."""

    FORMAT = UNPACK = "w6a16"
    BITS = 6


class W5A16Gemv(GroupedGemv):
    """5-bit weights in groups (five eighths of int8's bytes), 16-bit activations: as w6a16, one bit fewer."""

    FORMAT = UNPACK = "w5a16"
    BITS = 5


class W4A8Gemv(GroupedGemv):
    """w4a8 on quantspec's kernels: w4a16's weights, activations quantized per token to int8 at the input. For
    a few rows the kernel takes the nibbles against the int8 x (VPDPBUSD on x86: half w4a16's instructions per
    weight); for more (a prefill) the int8 x, exact in bf16, meets the weight unpacked to bf16 in one GEMM and
    is scaled back after: the same quantization on both paths."""

    FORMAT, UNPACK = "w4a8", "w4a16"
    BITS = 4

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x2, lead = _flat(x)
        x2 = x2.to(torch.bfloat16).contiguous()
        if x2.shape[0] > MAX_ROWS:
            x_q, x_scale = torch.ops.quantspec.quantize_x8_bf16(x2)
            y = self._prefill(x_q).to(torch.bfloat16)  # rounded as the bf16 GEMM rounds, then scaled alike
            return self._finish(torch.ops.quantspec.scale_rows_bf16(y, x_scale), x, lead)
        y = torch.ops.quantspec.gemv_w4a8(x2, self.wg, self.wg_scale, self.wg_offset, self.group)
        return self._finish(y, x, lead)


class GroupedLinear(QuantLinear):
    """A grouped format off quantspec's kernels (no compiler, or another device) where ATen has no kernel for
    its bits: the weight unpacked to x's dtype a block of output channels at a time, then one GEMM per block
    (the gemv modules' prefill, in torch operators). The same weights and arithmetic as the kernels' path."""

    BITS: int
    BLOCK_ROWS = 4096
    STEP_BUFFERS = ("q", "scale", "zero")

    def __init__(
        self,
        q: torch.Tensor,
        scale: torch.Tensor,
        zero: torch.Tensor,
        group: int,
        bias: torch.Tensor | None = None,
        lanes: bool = True,
    ):
        """q: the packed bytes in either stored form (qparams.packed_weights; `lanes` says which)."""
        # its shape from the packed bytes: the weight is unpacked a block at a time in forward, never here
        super().__init__(q.shape[1] * 8 // self.BITS, q.shape[0], None if bias is None else bias.to(torch.bfloat16))
        self.group, self.lanes = group, lanes
        self.register_buffer("q", q.contiguous(), persistent=False)  # packed: BITS / 8 bytes a weight
        self.register_buffer("scale", scale.float().contiguous(), persistent=False)
        self.register_buffer("zero", zero.float().contiguous(), persistent=False)

    @classmethod
    def from_tensors(cls, t, group, dtype):
        q, lanes = qparams.packed_weights(t, cls.BITS)
        return cls(q, t["scale"], t["zero"], group, t.get("bias"), lanes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x2, lead = _flat(x)
        x2 = x2.to(torch.bfloat16)
        y = x2.new_empty(x2.shape[0], self.out_features)
        for n0 in range(0, self.out_features, self.BLOCK_ROWS):
            n1 = min(n0 + self.BLOCK_ROWS, self.out_features)
            values = qparams.unpack_weights(self.q[n0:n1], self.BITS, self.lanes)
            w = qparams.groups_dequant(values, self.scale[n0:n1], self.zero[n0:n1], self.group, self.BITS)
            torch.mm(x2, w.to(x2.dtype).t(), out=y[:, n0:n1])
        return self._finish(y, x, lead)


class W2A16Linear(GroupedLinear):
    """w2a16 off quantspec's kernels: ATen has no 2-bit kernel."""

    BITS = 2


class W6A16Linear(GroupedLinear):
    """w6a16 off quantspec's kernels: ATen has no 6-bit kernel."""

    BITS = 6


class W5A16Linear(GroupedLinear):
    """w5a16 off quantspec's kernels: ATen has no 5-bit kernel."""

    BITS = 5


# --- portable tensors: what the quantizer produces and the cache stores ----------------------------


def int8_tensors(weight: torch.Tensor, bias: torch.Tensor | None) -> dict[str, torch.Tensor]:
    w_q, w_scale = qparams.int8_per_channel(weight)
    return packed_tensors(w_q, w_scale, None, bias, 8)


def grouped_tensors(
    weight: torch.Tensor, bias: torch.Tensor | None, group: int, bits: int, clip: torch.Tensor | None = None
) -> dict[str, torch.Tensor]:
    q, scale, zero = qparams.int_groups(weight, group, bits, clip)
    return packed_tensors(q, scale, zero, bias, bits)


def packed_tensors(
    q: torch.Tensor, scale: torch.Tensor, zero: torch.Tensor | None, bias: torch.Tensor | None, bits: int
) -> dict[str, torch.Tensor]:
    """The portable tensors of rounded weights: int8 q [N, K] with a scale per row (zero None), or b-bit q in
    groups with scale and zero per group, its values packed as the cache stores them (qparams.pack_weights)."""
    extra = {"bias": bias.detach().float()} if bias is not None else {}
    if zero is None:
        return {"w_q": q, "w_scale": scale, **extra}
    return {**qparams.pack_weights(q, bits), "scale": scale, "zero": zero, **extra}


def int4_tensors(
    weight: torch.Tensor, bias: torch.Tensor | None, group: int, clip: torch.Tensor | None = None
) -> dict[str, torch.Tensor]:
    return grouped_tensors(weight, bias, group, 4, clip)


def w8a8_linears(model: nn.Module) -> list[nn.Module]:
    return [m for m in model.modules() if isinstance(m, W8A8Linear)]


def install_prefill(model: nn.Module, path: str) -> int:
    """Set every w8a8 linear's many-row path; returns how many."""
    linears = w8a8_linears(model)
    for module in linears:
        module.prefill = path
    return len(linears)


def install_prefill_activations(model: torch.nn.Module, kind: str) -> dict[str, int]:
    """Set every grouped linear's prefill activations (precision.prefill_activations); returns how many linears run
    them on the kernels' own int8 GEMM ("kernels") and how many on the fp32 fallback ("torch": a variant, or a
    format, with none of its own), or on bf16 ("bf16")."""
    counts: dict[str, int] = {}
    for module in model.modules():
        if not isinstance(module, GroupedGemv) or isinstance(module, W4A8Gemv):  # w4a8: per row on every path
            continue
        module.prefill_activations = kind
        if kind == "int8":
            where = "kernels" if torch.ops.quantspec.has_gemm_grouped_x8(module.format) else "torch"
        else:
            where = kind
        counts[where] = counts.get(where, 0) + 1
    return counts
