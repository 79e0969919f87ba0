"""Quantization's fp32 GEMMs from bf16 operands on quantspec's own kernel (the binding's gemm_bf16: AVX512-BF16's
VDPBF16PS, each product of two bf16 values exact in fp32, summed in fp32), where torch has none: on the CPU torch
multiplies bf16 tensors only into bf16 results, and its fp32 GEMMs in oneDNN's bf16 math mode (src.quant.bf16math)
measured no faster than fp32 on an AVX512-BF16 EPYC without AMX.

Two uses: a calibration Gram X^T X of bf16 rows (`gram_upper`: nothing rounded, the fp32 GEMM's result up to the
order of its sums), and GPTQ's block updates (`addmm_panels_`, each block's errors packed once by `panels` and a
run of blocks' `joined`: the factor's and the errors' values rounded to bf16, a relative 2^-9 of each update,
which is itself of the order of a rounding step: far below the bf16 weights' own precision). `native()` says whether the loaded kernels have it; where not, callers use torch's fp32 GEMMs.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

PANEL = 32  # columns of B per panel, as the kernel reads them (api.h)


def native() -> bool:
    """Whether quantspec's kernels are loaded in this process with a bf16 dot product (the avx512 variant)."""
    try:
        return bool(torch.ops.quantspec.has_gemm_bf16())
    except (AttributeError, RuntimeError):
        return False


def pairs(a: torch.Tensor) -> torch.Tensor:
    """A [M, K] as the kernel reads it: bf16 row-major, as int32 pairs along K ([M, ceil(K / 2)]; an odd K padded
    with a zero)."""
    if a.shape[1] % 2:
        a = F.pad(a, (0, 1))
    return _bf16(a).view(torch.int32)


def panels(b: torch.Tensor) -> torch.Tensor:
    """B [K, N] as the kernel reads it: int32 [ceil(N / 32), ceil(K / 2), 32], panel p's pair k the bf16 values of
    rows 2k and 2k + 1 of columns 32 p .. 32 p + 31, interleaved (zero past N, and a zero row past an odd K): each
    panel's pairs contiguous, so a tile's run over K reads one stream."""
    k, n = b.shape
    if n % PANEL or k % 2:
        b = F.pad(b, (0, -n % PANEL, 0, k % 2))
    k2, p = b.shape[0] // 2, b.shape[1] // PANEL
    # reordered and converted in one pass (the error blocks GPTQ sends on: 128 x n float32 each)
    return _bf16(b.view(k2, 2, p, PANEL).permute(2, 0, 3, 1)).view(torch.int32).view(p, k2, PANEL)


def _bf16(t: torch.Tensor) -> torch.Tensor:
    """`t` as bf16 in C order, in one pass whatever its dtype and strides (a block of a larger matrix, a permuted
    view): torch's .to keeps a view's strides and .contiguous copies again."""
    return torch.empty(t.shape, dtype=torch.bfloat16).copy_(t)


def addmm_(c: torch.Tensor, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """c += a @ b in place (c float32 [M, N], its rows contiguous), a and b rounded to bf16."""
    return addmm_panels_(c, a, panels(b))


def addmm_panels_(c: torch.Tensor, a: torch.Tensor, bp: torch.Tensor) -> torch.Tensor:
    """c += a @ B in place, B given as `panels` gives it (or `joined`'s), a rounded to bf16."""
    torch.ops.quantspec.gemm_bf16(c, pairs(a), bp, False)
    return c


def joined(parts: list[torch.Tensor]) -> torch.Tensor:
    """`panels` of B's rows in parts, top to bottom, as panels of the whole (each part of an even number of rows:
    a padded odd one would shift the rest): the panels' pairs joined along K, a copy of bf16 values, where
    converting the whole again had been a second pass over float32 through a permuted view."""
    return torch.cat(parts, dim=1)


def gram_upper(x: torch.Tensor) -> torch.Tensor:
    """X^T X of bf16 rows x [T, K] in float32: its upper triangle, the rest zero (the kernel sums only the 32-column
    panels each row reaches; the diagonal panels' parts below the diagonal are zeroed after)."""
    k = x.shape[1]
    out = torch.zeros(k, k)
    torch.ops.quantspec.gemm_bf16(out, pairs(x.T), panels(x), True)  # A = X^T [K, T], B = X [T, K]
    for r0 in range(0, k, PANEL):
        block = out[r0 : r0 + PANEL, r0 : r0 + PANEL]
        block.copy_(block.triu())
    return out
