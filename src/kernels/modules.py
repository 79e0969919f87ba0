"""Route a model's small-batch matmuls (decode steps, draft verification) to quantspec's kernels.

`install(model)` swaps each float nn.Linear for a GemvLinear sharing its parameters (a tied head stays
tied) and fuses the RMSNorms; quantized linears were built with their gemv path (src.quant.linear). Calls with more rows than
src.kernels.MAX_ROWS (prefill) keep ATen's GEMMs: for bf16, one bf16 GEMM, or the same values made fp32 and one
fp32 GEMM where this host runs that faster (`many_rows_mm`; src.quant.prefill measures which and sets it).
"""

from __future__ import annotations

from collections import Counter

import torch
from torch import nn
from torch.nn import functional as F

from src.kernels import MAX_ROWS

GEMV_DTYPES = (torch.float32, torch.bfloat16)
FLOAT_GEMMS = ("bf16", "fp32")  # how a bf16 GEMM of many rows runs (src.quant.prefill chooses per host)
# fp32's copy of a bf16 weight is made a block of output rows at a time, ~8 MB: a 262144-row head made fp32
# whole would be 670 MB for one call.
FP32_BLOCK_BYTES = 8 << 20


def many_rows_mm(x: torch.Tensor, w: torch.Tensor, path: str) -> torch.Tensor:
    """x [M, K] @ w [N, K].T. For bf16 x and a bf16 (or int8) w under "fp32": both made fp32 (exactly: every
    bf16 and int8 is an fp32), a block of w's rows at a time, and multiplied by fp32 GEMMs, the result fp32. A
    CPU without bf16 dot products (AVX2, AVX-512 without BF16) runs ATen's bf16 GEMM far below its fp32 one;
    both sum the same products in fp32, so they differ only in the order of the sums. Otherwise one GEMM in x's
    dtype (an int8 w made x's dtype first)."""
    if path != "fp32" or x.dtype != torch.bfloat16 or w.dtype not in (torch.bfloat16, torch.int8):
        return torch.mm(x, w.to(x.dtype).t())
    xf, w = x.detach().float(), w.detach()  # inference only: mm's out= takes no tensor that requires grad
    y = xf.new_empty(x.shape[0], w.shape[0])
    block = max(64, FP32_BLOCK_BYTES // (4 * w.shape[1]) // 64 * 64)
    for n0 in range(0, w.shape[0], block):
        n1 = min(n0 + block, w.shape[0])
        torch.mm(xf, w[n0:n1].float().t(), out=y[:, n0:n1])
    return y


class GemvLinear(nn.Module):
    """nn.Linear's parameters, forward through gemv_float for a few rows and a GEMM otherwise."""

    float_gemm = "bf16"  # a bf16 weight's GEMM of many rows (FLOAT_GEMMS; the job sets the host's choice)

    def __init__(self, linear: nn.Linear):
        super().__init__()
        self.in_features, self.out_features = linear.in_features, linear.out_features
        self.weight, self.bias = linear.weight, linear.bias

    @property
    def bf16_gemm(self) -> bool:
        """Whether its many-row calls are a bf16 GEMM (what `float_gemm` decides)."""
        return self.weight.dtype == torch.bfloat16

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x2 = x.reshape(-1, x.shape[-1])
        many = x2.shape[0] > MAX_ROWS
        if x.dtype != self.weight.dtype or (many and self.float_gemm != "fp32"):
            return F.linear(x, self.weight, self.bias)
        if many:  # made fp32 (many_rows_mm multiplies any other weight as it is)
            y = many_rows_mm(x2, self.weight, self.float_gemm)
            if self.bias is not None:
                y = y + self.bias
            return y.to(x.dtype).reshape(*x.shape[:-1], self.out_features)
        y = torch.ops.quantspec.gemv_float(x2, self.weight)
        if self.bias is not None:
            y = y + self.bias
        return y.reshape(*x.shape[:-1], self.out_features)

    def select_rows(self, ids: torch.Tensor) -> GemvLinear:
        """These output rows only (a draft's cut-down head), on the same kernel."""
        cut = nn.Linear(self.in_features, len(ids), bias=self.bias is not None, dtype=self.weight.dtype)
        with torch.no_grad():
            cut.weight.copy_(self.weight[ids])
            if self.bias is not None:
                cut.bias.copy_(self.bias[ids])
        out = GemvLinear(cut)
        out.float_gemm = self.float_gemm
        return out

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, bias={self.bias is not None}"


class FusedRMSNorm(nn.Module):
    """A transformers RMSNorm's weight and epsilon, forward in one kernel call (norm.cpp)."""

    def __init__(self, norm: nn.Module, gemma: bool):
        super().__init__()
        self.weight, self.gemma = norm.weight, gemma
        self.eps = float(getattr(norm, "eps", getattr(norm, "variance_epsilon", 1e-6)))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.ops.quantspec.rms_norm(x, self.weight, self.eps, self.gemma)

    def extra_repr(self) -> str:
        return f"{tuple(self.weight.shape)}, eps={self.eps}, gemma={self.gemma}"


def norm_convention(module: nn.Module) -> bool | None:
    """Which of norm.cpp's conventions a transformers RMSNorm (a class named *RMSNorm) follows, found by running it
    once on a fixed row: True where it scales by (1 + w) in float32 (Gemma's), False where by w after the cast back
    (Llama's, Qwen2's, Mistral's), None where neither or not an RMSNorm (it stays as it is). Run, not looked up by
    class: no family is named here, and a new family's norm is fused as soon as it behaves as one of the two."""
    weight = getattr(module, "weight", None)
    eps = getattr(module, "eps", getattr(module, "variance_epsilon", None))
    if not type(module).__name__.endswith("RMSNorm") or weight is None or weight.dim() != 1 or eps is None:
        return None
    w = weight.detach()
    x = torch.linspace(-2.0, 3.0, w.numel(), dtype=w.dtype)[None]
    with torch.no_grad():
        got = module(x).float()
    unit = F.rms_norm(x.float(), (w.numel(),), eps=float(eps))
    for gemma, want in ((True, unit * (1.0 + w.float())), (False, (unit.to(w.dtype) * w).float())):
        if torch.allclose(got, want, rtol=1e-2, atol=1e-3):
            return gemma
    return None


def _fits(linear: nn.Linear) -> bool:
    # The kernels step through K in 32s; anything else stays on ATen.
    return linear.weight.dtype in GEMV_DTYPES and linear.in_features % 32 == 0 and linear.weight.is_contiguous()


def accelerated(module: nn.Module) -> nn.Module:
    """A float linear module on the gemv path (a GemvLinear), or the module itself. Quantized modules
    get theirs when they are built (src.quant.formats.build, gemv=True)."""
    if isinstance(module, nn.Linear) and _fits(module):
        return GemvLinear(module)
    return module


def installed(model: nn.Module) -> bool:
    """Whether this model's steps run on quantspec's kernels (install, or quantized modules built with their
    gemv path): read from the model the job assembled, not from what this process happens to have loaded."""
    return any(isinstance(m, (GemvLinear, FusedRMSNorm)) or type(m).__name__.endswith("Gemv") for m in model.modules())


def install(model: nn.Module) -> Counter:
    """Swap in place; returns how many modules of each class now take the gemv path."""
    counts: Counter = Counter()
    for name, module in list(model.named_modules()):
        gemma = norm_convention(module)
        if gemma is not None and module.weight.dtype in GEMV_DTYPES:
            model.set_submodule(name, FusedRMSNorm(module, gemma))
            counts["fused_rms_norm"] += 1
            continue
        fast = accelerated(module)
        if fast is not module:
            model.set_submodule(name, fast)
            counts[f"gemv_{str(module.weight.dtype).removeprefix('torch.')}"] += 1
        elif type(module).__name__.endswith("Gemv"):  # built so by src.quant.linear
            counts[f"gemv_{type(module).__name__}"] += 1
    return counts
