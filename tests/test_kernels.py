"""quantspec's own kernels (src/kernels): each against a float64 reference, and installed in tiny models.

Skipped, with the reason, on a machine whose CPU lacks AVX-512 BF16/VNNI or has no compiler.
"""

import os
from pathlib import Path

import pytest
import torch
from transformers.models.gemma3.modeling_gemma3 import Gemma3RMSNorm
from transformers.models.llama.modeling_llama import LlamaRMSNorm

from src import kernels
from src.engine import ENGINES, Sampling
from src.engine.native import Decoder
from src.kernels import modules
from src.quant import qparams
from src.quant.aten_ops import pack_w4
from src.quant.linear import build, int4_tensors, int8_tensors
from src.tiny import tiny_model

ARCHS = ["llama", "opt", "qwen2", "gemma3"]


@pytest.fixture(scope="module", autouse=True)
def built():
    # The runtime's own build directory: CI compiles once for the tests and the main command.
    if not kernels.load(Path(os.environ.get("QUANTSPEC_CACHE", "~/.cache/quantspec")) / "kernels"):
        pytest.skip(f"quantspec kernels unavailable here: {kernels.reason()}")


def _rel_err(y: torch.Tensor, ref: torch.Tensor) -> float:
    return float((y.double() - ref).abs().max() / ref.abs().max())


SHAPES = [(1, 37, 128), (2, 64, 256), (5, 41, 640), (7, 16, 128), (8, 9, 64)]  # M > 6 takes two passes


@pytest.mark.parametrize("m,n,k", SHAPES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_gemv_float_matches_matmul(m, n, k, dtype):
    torch.manual_seed(m * n)
    x, w = torch.randn(m, k).to(dtype), torch.randn(n, k).to(dtype)
    y = torch.ops.quantspec.gemv_float(x, w)
    assert y.dtype == dtype and y.shape == (m, n)
    # bf16 inputs are exact in float64; what is left is fp32 accumulation and the output's rounding
    assert _rel_err(y, x.double() @ w.double().t()) < (1e-6 if dtype == torch.float32 else 8e-3)


@pytest.mark.parametrize("m,n,k", [s for s in SHAPES if s[2] % 64 == 0])
def test_gemv_w8a8_matches_int8_reference(m, n, k):
    torch.manual_seed(m + n)
    x, w = torch.randn(m, k), torch.randn(n, k)
    w_q, w_s = qparams.int8_per_channel(w)
    y = torch.ops.quantspec.gemv_w8a8(x, w_q, w_s, w_q.sum(1, dtype=torch.int32))
    x_q, x_s = qparams.int8_per_token(x)
    ref = (x_q.double() @ w_q.double().t()) * x_s.double() * w_s.double()
    assert _rel_err(y, ref) < 1e-5  # the integer sums are exact; only the scaling rounds


@pytest.mark.parametrize("m,n,k", SHAPES)
def test_gemv_w8a16_matches_int8_weight_reference(m, n, k):
    torch.manual_seed(m + 2 * n)
    x, w = torch.randn(m, k).bfloat16(), torch.randn(n, k)
    w_q, w_s = qparams.int8_per_channel(w)
    y = torch.ops.quantspec.gemv_w8a16(x, w_q, w_s)
    ref = x.double() @ (w_q.double() * w_s.double()[:, None]).t()
    assert _rel_err(y, ref) < 8e-3  # int8 and bf16 are exact in registers; the sums are fp32


@pytest.mark.parametrize("m,n,k,group", [(*s, 128) for s in SHAPES if s[2] % 128 == 0] + [(3, 20, 512, 256)])
def test_gemv_w4a16_matches_dequantized_reference(m, n, k, group):
    torch.manual_seed(m * 3 + n)
    x, w = torch.randn(m, k).bfloat16(), torch.randn(n, k)
    q, scale, zero = qparams.int4_groups(w, group)
    offset = (zero - qparams.INT4_MID * scale).contiguous()
    y = torch.ops.quantspec.gemv_w4a16(x, pack_w4(q), scale.contiguous(), offset, group)
    ref = x.double() @ qparams.int4_dequant(q, scale, zero, group).double().t()
    assert _rel_err(y, ref) < 1e-2  # dequantized weights are rounded to bf16 in registers


def test_int4_weight_unpacks_to_bf16_for_prefill_and_the_gemv_reads_it_unrounded():
    torch.manual_seed(5)
    w = torch.randn(24, 512)
    q, scale, zero = qparams.int4_groups(w, 256)
    offset = (zero - qparams.INT4_MID * scale).contiguous()
    dense = torch.ops.quantspec.dequant_w4a16(pack_w4(q), scale.contiguous(), offset, 256)
    # q * scale + offset rounded once to float32 (the kernel's FMA; exact in float64 first), then to bf16
    ref = (q.double().reshape(24, 2, 256) * scale.double()[..., None] + offset.double()[..., None]).reshape(24, 512)
    assert dense.dtype == torch.bfloat16 and torch.equal(dense, ref.float().bfloat16())
    x = torch.zeros(1, 512)
    x[0, 300] = 1   # one input channel: the gemv returns that column of the weight, in float32
    torch.testing.assert_close(torch.ops.quantspec.gemv_w4a16(x, pack_w4(q), scale.contiguous(), offset, 256)[0],
                               ref[:, 300].float(), rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("kind", ["w8a16", "w4a16"])
def test_16_bit_activations_are_as_precise_as_float32_not_bf16(kind):
    # x quantized per row to int16 in the kernel: against a float64 reference with x as given (float32),
    # the error is far below what rounding x to bf16 would cost (~2^-9 of the largest term).
    torch.manual_seed(11)
    x, w = torch.randn(3, 1024) * torch.logspace(-2, 1, 1024), torch.randn(40, 1024)
    if kind == "w8a16":
        w_q, w_s = qparams.int8_per_channel(w)
        y = torch.ops.quantspec.gemv_w8a16(x, w_q, w_s)
        dense = w_q.double() * w_s.double()[:, None]
    else:
        q, scale, zero = qparams.int4_groups(w, 128)
        y = torch.ops.quantspec.gemv_w4a16(x, pack_w4(q), scale.contiguous(),
                                           (zero - qparams.INT4_MID * scale).contiguous(), 128)
        dense = qparams.int4_dequant(q, scale, zero, 128).double()
    assert y.dtype == torch.float32
    assert _rel_err(y, x.double() @ dense.t()) < 2e-4
    assert _rel_err(x.bfloat16().double() @ dense.t(), x.double() @ dense.t()) > 5e-4   # what bf16 x would cost


def test_16_bit_activation_sums_cannot_overflow():
    # The worst case for int32 sums: every weight at 127 and every activation at the int16 limit, over a
    # K of many 4096-value spans (the kernel folds its int32 sums into fp32 once per span).
    k = 16384
    x, w_q = torch.full((1, k), 3.0), torch.full((8, k), 127, dtype=torch.int8)
    y = torch.ops.quantspec.gemv_w8a16(x, w_q, torch.full((8,), 0.5))
    torch.testing.assert_close(y, torch.full((1, 8), 3.0 * 127 * 0.5 * k), rtol=1e-5, atol=0)  # fp32 rounding only
    q = torch.full((8, k), 15, dtype=torch.uint8)
    y = torch.ops.quantspec.gemv_w4a16(x, pack_w4(q), torch.full((8, k // 128), 0.5), torch.zeros(8, k // 128), 128)
    torch.testing.assert_close(y, torch.full((1, 8), 3.0 * 15 * 0.5 * k), rtol=1e-5, atol=0)  # fp32 rounding only


def test_gemv_rejects_a_k_it_cannot_step_through():
    with pytest.raises(RuntimeError, match="multiple of"):
        torch.ops.quantspec.gemv_float(torch.randn(1, 40), torch.randn(8, 40))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("norm_cls,gemma", [(Gemma3RMSNorm, True), (LlamaRMSNorm, False)])
def test_fused_rms_norm_matches_transformers(norm_cls, gemma, dtype):
    torch.manual_seed(0)
    norm = norm_cls(96, eps=1e-6)
    with torch.no_grad():
        norm.weight.normal_()
    norm = norm.to(dtype)
    x = torch.randn(3, 5, 96).to(dtype)
    fused = modules.FusedRMSNorm(norm, gemma)
    torch.testing.assert_close(fused(x), norm(x), rtol=1e-5 if dtype == torch.float32 else 1e-2, atol=1e-5)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_decode_attention_matches_causal_sdpa_and_each_row_stands_alone(dtype):
    torch.manual_seed(0)
    heads, kv_heads, queries, length, dim = 4, 2, 5, 40, 32
    q = torch.randn(1, heads, queries, dim).to(dtype)
    k, v = (torch.randn(1, kv_heads, length, dim).to(dtype) for _ in range(2))
    visible = torch.arange(length)[None, :] <= torch.arange(length - queries, length)[:, None]
    ref = torch.nn.functional.scaled_dot_product_attention(q.double(), k.double(), v.double(), attn_mask=visible,
                                                           scale=0.2, enable_gqa=True)
    out = torch.ops.quantspec.decode_attention(q, k, v, 0.2)
    assert _rel_err(out, ref) < (1e-6 if dtype == torch.float32 else 1e-2)
    for i in range(queries):  # bit for bit what a one-query step over the shorter cache gives
        alone = torch.ops.quantspec.decode_attention(q[:, :, i:i + 1], k[:, :, :length - queries + i + 1],
                                                     v[:, :, :length - queries + i + 1], 0.2)
        assert torch.equal(alone[:, :, 0], out[:, :, i])


def test_quantized_modules_built_for_the_gemv_take_it_for_few_rows_only():
    torch.manual_seed(1)
    w = torch.randn(48, 128)
    for kind, tensors, dtype in (("w8a8", int8_tensors(w, None), torch.float32),
                                 ("w4a16", int4_tensors(w, None, 128), torch.bfloat16),
                                 ("w8a16", int8_tensors(w, None), torch.bfloat16)):
        aten, fast = (build(kind, tensors, 128, dtype, gemv) for gemv in (False, True))
        assert type(fast).__name__.endswith("Gemv") and not type(aten).__name__.endswith("Gemv")
        x = torch.randn(2, 3, 128).to(dtype)
        assert _rel_err(fast(x), aten(x).double()) < 1e-2  # both round to bf16 (w4a16) differently
        many = torch.randn(1, 20, 128).to(dtype)  # more rows than MAX_ROWS: a prefill
        if kind == "w4a16":   # the weight unpacked to bf16 as the gemv does, one GEMM: no ATen int4 copy kept
            assert not hasattr(fast, "packed")
            assert _rel_err(fast(many), aten(many).double()) < 1e-2
        else:                 # ATen's path, unchanged
            torch.testing.assert_close(fast(many), aten(many), rtol=0, atol=0)
        cut = fast.select_rows(torch.tensor([0, 5])) if hasattr(fast, "select_rows") else None
        assert cut is None or type(cut) is type(fast)   # a draft's cut head stays on the same kernels
    assert type(build("w8a8", int8_tensors(torch.randn(8, 96), None), None, torch.float32, True)).__name__ \
        == "W8A8Linear"   # K = 96 is no multiple of the w8a8 kernel's 64: ATen's
    assert type(build("w4a16", int4_tensors(w, None, 64), 64, torch.bfloat16, True)).__name__ \
        == "W4A16Linear"  # groups of 64 split the int4 kernel's 128-value loads: ATen's


@pytest.mark.parametrize("arch", ARCHS)
def test_installed_kernels_keep_greedy_output_and_tie_the_head(arch):
    model, tok = tiny_model(arch)
    ids = tok("def add(a, b):", return_tensors="pt").input_ids
    before = ENGINES["hf"](model, ids, 16, True, Sampling(), tok.pad_token_id)
    linears = sum(isinstance(m, torch.nn.Linear) for m in model.modules())
    counts = modules.install(model)
    assert counts["gemv_float32"] == linears  # every projection and the head
    if arch in ("llama", "qwen2", "gemma3"):
        assert counts["fused_rms_norm"] > 0
    if model.config.tie_word_embeddings:
        assert model.lm_head.weight is model.get_input_embeddings().weight
    native = ENGINES["native"](model, ids, 16, True, Sampling(), tok.pad_token_id)
    hf = ENGINES["hf"](model, ids, 16, True, Sampling(), tok.pad_token_id)
    assert native.new_token_ids == hf.new_token_ids == before.new_token_ids


@pytest.mark.parametrize("arch", ["gemma3", "llama", "qwen2", "opt"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_with_kernels_the_lean_path_verifies_exactly_like_steps(dtype, arch):
    """Every op on the lean path treats rows alone: a k-token verification gives the same logits, bit for
    bit, as k one-token steps, so speculative decoding reproduces plain decoding even in bf16."""
    model, tok = tiny_model(arch)
    model = model.to(dtype)
    modules.install(model)
    ids = tok("def f(x):", return_tensors="pt").input_ids
    tokens = [70, 71, 72, 73, 74]
    with torch.inference_mode():
        stepper, verifier = Decoder(model, fast=True), Decoder(model, fast=True)
        stepper.prefill(ids)
        verifier.prefill(ids)
        steps = torch.stack([stepper.step(t) for t in tokens])
        block = verifier.verify(tokens)
    assert torch.equal(block, steps)


def test_a_cut_head_keeps_its_kernels_when_it_is_cut_again():
    from src.engine.subset_head import cut_head
    model, _ = tiny_model("llama")
    cut_head(model, torch.tensor([1, 2, 3]))
    modules.install(model)
    head = model.get_output_embeddings()
    assert isinstance(head.head, modules.GemvLinear)
    head.focus([5, 6])   # a prompt's own tokens: the rows are cut again, from the swapped full head
    assert isinstance(head.head, modules.GemvLinear) and {5, 6} <= set(head.ids.tolist())
