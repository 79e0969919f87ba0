"""ATen's low-bit kernels, each behind one small function, so a runtime module's forward is one call.

(Decode steps of at most a few rows go to quantspec's own kernels instead, src/kernels, where loaded.)
All are ATen CPU kernels shipped with torch (measured on this project's machine for one row through
Gemma 3's 262144x640 head: fp32 58 ms, bf16 18, int8 x int8 6.8, int8-weight 7.3, int4-weight 4.0).
"""

from __future__ import annotations

import torch

# The CPU int4 kernel packs K in tiles; 2 inner tiles is what its ATen tests and gpt-fast use.
INT4_INNER_K_TILES = 2


def int8_weight_matmul(x: torch.Tensor, w_q: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """16-bit [M, K] @ (int8 [N, K] * scale [N]).T -> [M, N] in x's dtype (w8a16)."""
    return torch._weight_int8pack_mm(x, w_q, scale)


def pack_int4(q: torch.Tensor) -> torch.Tensor:
    """[N, K] values 0..15 -> the CPU int4 kernel's packed layout (machine-specific: never stored)."""
    return torch._convert_weight_to_int4pack_for_cpu(q.to(torch.int32), INT4_INNER_K_TILES)


def pack_w4(q: torch.Tensor) -> torch.Tensor:
    """[N, K] values 0..15 -> quantspec's gemv layout: per 128 values, 64 bytes whose 16-bit lane i
    holds values i, i+32, i+64, i+96 in its four nibbles (the kernel shifts a lane to pick one)."""
    n, k = q.shape
    b = q.to(torch.uint8).reshape(n, k // 128, 4, 32)
    lanes = torch.stack([b[:, :, 0] | b[:, :, 1] << 4, b[:, :, 2] | b[:, :, 3] << 4], dim=-1)  # bytes 2i, 2i+1
    return lanes.reshape(n, k // 2).contiguous()


def int4_weight_matmul(x: torch.Tensor, packed: torch.Tensor, group: int, scales_zeros: torch.Tensor) -> torch.Tensor:
    """bf16 [M, K] @ int4 groups -> bf16 [M, N] (w4a16). scales_zeros: [K/group, N, 2] bf16."""
    return torch._weight_int4pack_mm_for_cpu(x, packed, group, scales_zeros)
