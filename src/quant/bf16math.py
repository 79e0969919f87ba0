"""fp32 GEMMs with bf16 operands, where the CPU multiplies bf16 natively: AMX's tiles, AVX512-BF16's dot products.

oneDNN's bf16 math mode (torch.backends.mkldnn.matmul.fp32_precision = "bf16") rounds an fp32 GEMM's operands to
bf16 and sums their products in fp32, into an fp32 result. Two uses in quantization:

- operands that are bf16 values already (a bf16 model's activations, as a Gram's rows): nothing is rounded, each
  product is exact in fp32 (8-bit significands), so the result is an fp32 GEMM's up to the order of its sums;
  on an AMX host ~2.2x as fast (an 11008-wide Gram of 4096 rows: 1.4 s against 3.2);
- AWQ's scale search where its trials are not one GEMM of the outputs' change (w4a8's int8 activations, the MLP's
  block loss), whose trial weights are not bf16 values: their losses rank ~20 candidates, and AWQ's reference
  scores them in fp16 GEMMs (its model's dtype), coarser than these.

Where torch has no bf16 path for the CPU (no AVX512-BF16 or AMX: an AVX2 host) the mode is ignored and the GEMMs are
fp32's, so the same code runs everywhere; `native()` says which. `native()` says only that the mode takes effect,
not that it is faster: on an AVX512-BF16 EPYC without AMX it measured no faster than fp32 (a GPTQ update 176 GF/s
against 167; an 11008-wide Gram 180-187 GF/s) while that CPU's bf16-tensor GEMMs ran at ~400 GF/s. So the Grams
take this mode only on AMX hosts, and quantspec's own kernel elsewhere (src.quant.bf16gemm); AWQ's scale search
scores its other trials by bf16 tensors' GEMMs (src.quant.awq.search_scale).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch


def native() -> bool:
    """Whether torch multiplies bf16 natively on this CPU (so the bf16 math mode takes effect)."""
    return bool(torch.cpu._is_avx512_bf16_supported() or torch.cpu._is_amx_tile_supported())


@contextmanager
def operands() -> Iterator[None]:
    """fp32 matmuls inside run with bf16 operands and fp32 sums (where native()); the mode before is restored."""
    matmul = torch.backends.mkldnn.matmul
    before = matmul.fp32_precision
    matmul.fp32_precision = "bf16"
    try:
        yield
    finally:
        matmul.fp32_precision = before
