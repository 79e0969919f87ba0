"""Tiny models at every precision on quantspec's kernels, for the engine's tests (the C++ step, batching)."""

import torch

from src import kernels
from src.kernels import modules
from src.models.tiny import tiny_model
from src.quant.pipeline import install, quantize
from tests.support.kernels import KERNELS
from tests.support.quant import calib, quant_spec

QUANT = {
    "w8a8": (quant_spec("smoothquant", "w8a8", alpha=0.5), torch.float32),
    "w8a16": (quant_spec("smoothquant", "w8a16", alpha=0.5), torch.bfloat16),
    "w4a16": (
        quant_spec("rtn", "w4a16", group_size=128, head_format="w8a16", wide_linears=("self_attn.v_proj",)),
        torch.bfloat16,
    ),
    "w4a8": (
        quant_spec("rtn", "w4a8", group_size=128, head_format="w8a16", wide_linears=("self_attn.v_proj",)),
        torch.bfloat16,
    ),
    "w2a16": (quant_spec("rtn", "w2a16", group_size=128, head_format="w8a16"), torch.bfloat16),
    # a 4-bit precision whose head runs the 5-bit format (rounded by GPTQ) and its wide linears the 6-bit one
    "w4a16-w5w6": (
        quant_spec(
            "rtn",
            "w4a16",
            group_size=128,
            head_format="w5a16",
            wide_linears=("self_attn.v_proj",),
            wide_format="w6a16",
            gptq=("lm_head",),
        ),
        torch.bfloat16,
    ),
}
PRECISIONS = ["fp32", "bf16", *QUANT]


def model_at(arch: str, precision: str):
    """A tiny `arch` model at `precision` on quantspec's kernels: the variant loaded (a test's isa fixture's), else
    the best this CPU runs."""
    if not kernels.loaded():
        kernels.load(KERNELS)
    model, tok = tiny_model(arch)
    if precision in QUANT:
        spec, dtype = QUANT[precision]
        install(model.to(dtype), quantize(model, arch, spec, calib(tok)), dtype, gemv=True)
    else:
        model = model.to(torch.bfloat16 if precision == "bf16" else torch.float32)
    modules.install(model)
    return model, tok
