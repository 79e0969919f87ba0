"""ATen's low-bit kernels, each behind one small function, so a runtime module's forward is one call.

(Decode steps of at most a few rows go to quantspec's own kernels instead, src/kernels, where loaded.)
On the CPU all are ATen CPU kernels shipped with torch (measured on this project's machine for one row
through Gemma 3's 262144x640 head: fp32 58 ms, bf16 18, int8 x int8 6.8, int8-weight 7.3, int4-weight 4.0).
On a CUDA device the same functions take ATen's CUDA kernels, from the same portable tensors: tinygemm for
int4 (its zero-point convention is quantspec's: w = (q - 8) * scale + zero), the int8-weight kernel where
the device's torch has one (else the weight made 16-bit inside the call), and int8 x int8 through _int_mm.
"""

from __future__ import annotations

import torch

from src.quant import qparams

# The CPU int4 kernel packs K in tiles; 2 inner tiles is what its ATen tests and gpt-fast use.
INT4_INNER_K_TILES = 2
# torch._int_mm on CUDA takes more than 16 rows (a multiple of 8 is cuBLASLt's tiling): a decode step's few rows
# are padded with zero rows to this many. The weight is read once whatever the rows, so a GEMV pays little.
INT_MM_MIN_ROWS = 24

_int8pack: dict[str, bool] = {}  # device type -> whether its torch has the int8-weight kernel (tried once)


def int8_weight_matmul(x: torch.Tensor, w_q: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """16-bit [M, K] @ (int8 [N, K] * scale [N]).T -> [M, N] in x's dtype (w8a16). Where the device's torch
    has no int8-weight kernel, the weight is made x's dtype in the call (exact: |q| <= 127) and scaled after."""
    kind = x.device.type
    if _int8pack.get(kind, True):
        try:
            return torch._weight_int8pack_mm(x, w_q, scale)
        except (NotImplementedError, RuntimeError):
            if kind in _int8pack:  # it ran here before: this failure is the call's own
                raise
            _int8pack[kind] = False
        else:
            _int8pack[kind] = True
    return dequantized_int8_matmul(x, w_q, scale)


def dequantized_int8_matmul(x: torch.Tensor, w_q: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """int8_weight_matmul without the kernel: one 16-bit GEMM over the weight made x's dtype."""
    return torch.mm(x, w_q.to(x.dtype).t()) * scale


def int8_matmul(x: torch.Tensor, w_q: torch.Tensor, w_scale: torch.Tensor) -> torch.Tensor:
    """w8a8 off the CPU: x [M, K] quantized per token to int8, times w_q int8 [N, K].T through _int_mm (exact
    int32 sums, the weight read as int8), scaled back: float32 [M, N]. Fewer than INT_MM_MIN_ROWS rows are
    padded with zero rows, sliced off after: the same sums. (Not int8 values in a bf16 GEMM, as the CPU's
    W4A8Linear does: the weight would be converted every call, and the sums rounded to bf16 at the output.)"""
    x_q, x_scale = qparams.int8_per_token(x)
    rows = x_q.shape[0]
    if rows < INT_MM_MIN_ROWS:
        x_q = torch.cat([x_q, x_q.new_zeros(INT_MM_MIN_ROWS - rows, x_q.shape[1])])
    y = torch._int_mm(x_q, w_q.t())[:rows].float()
    return y.mul_(x_scale).mul_(w_scale)


def inner_k_tiles(k: int) -> int:
    """tinygemm's (CUDA int4) K tiling: the most inner tiles of 16 that divide K (8 is its fastest)."""
    for tiles in (8, 4, 2):
        if k % (16 * tiles) == 0:
            return tiles
    raise ValueError(f"the CUDA int4 kernel needs input features that are a multiple of 32, not {k}")


def pack_int4(q: torch.Tensor) -> torch.Tensor:
    """[N, K] values 0..15 -> the int4 kernel's packed layout for q's device (machine-specific: never stored).
    CUDA's takes the bytes as quantspec stores them (qparams.pack_nibbles: even columns in the high nibble)."""
    if q.device.type == "cpu":
        return torch._convert_weight_to_int4pack_for_cpu(q.to(torch.int32), INT4_INNER_K_TILES)
    return torch._convert_weight_to_int4pack(qparams.pack_nibbles(q), inner_k_tiles(q.shape[1]))


def int4_weight_matmul(x: torch.Tensor, packed: torch.Tensor, group: int, scales_zeros: torch.Tensor) -> torch.Tensor:
    """bf16 [M, K] @ int4 groups -> bf16 [M, N] (w4a16). scales_zeros: [K/group, N, 2] bf16."""
    if x.device.type == "cpu":
        return torch._weight_int4pack_mm_for_cpu(x, packed, group, scales_zeros)
    return torch._weight_int4pack_mm(x, packed, group, scales_zeros)
