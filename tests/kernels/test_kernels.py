"""quantspec's own kernels (src/kernels): every test runs once per kernel variant of this architecture
(avx512, avx_vnni, avx2, reference on x86-64, and avx_vnni's EVEX twin), each against a float64
reference, against the reference variant, and installed in tiny models. A variant is skipped only where this CPU lacks its instructions; one that
cannot be built fails.
"""

import platform

import pytest
import torch
from transformers.models.gemma3.modeling_gemma3 import Gemma3RMSNorm
from transformers.models.llama.modeling_llama import LlamaRMSNorm

from src import kernels
from src.engine import GENERATE, Sampling
from src.engine.generation import Request
from src.engine.native import Decoder
from src.kernels import format_number, modules, variants
from src.models import families
from src.models.tiny import tiny_model
from src.quant import formats, qparams
from src.quant.formats import build
from src.quant.linear import int4_tensors, int8_tensors
from src.quant.qparams import SPLIT, pack_lanes
from tests.support.kernels import use_variant


def gemv_w4a16(x, packed, scale, offset, group):
    return torch.ops.quantspec.gemv_grouped(x, packed, scale, offset, group, format_number("w4a16"))


def dequant_w4a16(packed, scale, offset, group):
    return torch.ops.quantspec.dequant_grouped(packed, scale, offset, group, format_number("w4a16"))


ARCHS = families.NAMES  # every family src.models.families describes: a new one is tested here by its file alone


# On x86-64 also avx_vnni's code in its EVEX twin (variants.AVX_VNNI_TWIN), which AVX-512 VNNI hosts run.
HOST_VARIANTS = [v.name for v in variants.for_arch()] + (
    [variants.AVX_VNNI_TWIN.name] if platform.machine() == "x86_64" else []
)


@pytest.fixture(autouse=True, params=HOST_VARIANTS)
def isa(request):
    return use_variant(request.param)


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


# every grouped weight-only format the registry holds (w4a16, w2a16, ...): a new one is tested here unasked
GROUPED_A16 = [s for s in formats.grouped() if formats.get(s).act_bits == 16]


@pytest.mark.parametrize("format", GROUPED_A16)
@pytest.mark.parametrize("m,n,k,group", [(*s, 128) for s in SHAPES if s[2] % 128 == 0] + [(3, 20, 512, 256)])
def test_gemv_grouped_matches_dequantized_reference(format, m, n, k, group):
    bits = formats.get(format).bits
    torch.manual_seed(m * 3 + n)
    x, w = torch.randn(m, k).bfloat16(), torch.randn(n, k)
    q, scale, zero = qparams.int_groups(w, group, bits)
    offset = (zero - (1 << (bits - 1)) * scale).contiguous()
    packed = pack_lanes(q, bits)
    y = torch.ops.quantspec.gemv_grouped(x, packed, scale.contiguous(), offset, group, format_number(format))
    ref = x.double() @ qparams.groups_dequant(q, scale, zero, group, bits).double().t()
    assert _rel_err(y, ref) < 1e-2  # dequantized weights are rounded to bf16 in registers
    # the prefill's unpacking: q * scale + offset in one fused multiply-add (exact in float64 here, then
    # rounded to fp32 as the FMA rounds), rounded to bf16
    dense = torch.ops.quantspec.dequant_grouped(packed, scale.contiguous(), offset, group, format_number(format))
    exact = (q.double().reshape(n, -1, group) * scale[..., None].double() + offset[..., None].double()).reshape(n, k)
    assert torch.equal(dense, exact.float().bfloat16())
    for i in range(m):  # row independence: a row alone gives its row among m, bit for bit
        alone = torch.ops.quantspec.gemv_grouped(
            x[i : i + 1], packed, scale.contiguous(), offset, group, format_number(format)
        )
        assert torch.equal(alone[0], y[i])


def _x8_reference(x: torch.Tensor) -> torch.Tensor:
    """x rounded per block of 128 values to int8 (scale max|x| / 127, x / scale in float32 as the kernels divide,
    half to even), in float64."""
    blocks = x.float().view(x.shape[0], -1, 128)
    scale = blocks.abs().amax(-1, keepdim=True).clamp_min(1e-8) / 127
    return (torch.round(blocks / scale).clamp(-127, 127).double() * scale.double()).view(x.shape)


def test_the_int8_block_quantizer_is_torchs_rounding_bit_for_bit():
    torch.manual_seed(1)
    x = (torch.randn(5, 384) * torch.logspace(-3, 2, 384)).bfloat16()
    x[2, :128] = 0  # an all-zero block: the floor's scale, q = 0
    q, xs, xo = torch.ops.quantspec.quantize_x8_blocks(x)
    blocks = x.float().view(5, 3, 128)
    scale = blocks.abs().amax(-1).clamp_min(1e-8) / 127
    expect = torch.round(blocks / scale[..., None]).clamp(-127, 127)
    assert torch.equal(q.view(5, 3, 128).float(), expect) and torch.equal(xs, scale)
    assert torch.equal(xo, scale * expect.sum(-1))


@pytest.mark.parametrize("format", GROUPED_A16)
@pytest.mark.parametrize("m,n,k,group", [(1, 37, 128, 128), (5, 45, 640, 128), (17, 64, 512, 256), (40, 96, 256, 128)])
def test_the_int8_activation_gemm_is_the_block_rounded_x_times_the_weight(isa, format, m, n, k, group):
    """On every variant with a kernel of its own (the others run the module's fp32 fallback, tested below): against
    float64, bit for bit against the reference variant, each row alone as among m, and a panel's tail (n = 37, 45)."""
    if not torch.ops.quantspec.has_gemm_grouped_x8(format_number(format)):
        return  # this variant has none: GroupedGemv multiplies the same int8 x in fp32 (the fallback test)
    bits = formats.get(format).bits
    torch.manual_seed(m + n)
    x, w = torch.randn(m, k).bfloat16(), torch.randn(n, k)
    q, scale, zero = qparams.int_groups(w, group, bits)
    offset = (zero - (1 << (bits - 1)) * scale).contiguous()
    args = (pack_lanes(q, bits), scale.contiguous(), offset, group, format_number(format))
    y = torch.ops.quantspec.gemm_grouped_x8(x, *args)
    ref = _x8_reference(x) @ qparams.groups_dequant(q, scale, zero, group, bits).double().t()
    assert _rel_err(y, ref) < 1e-5
    for i in range(m):
        assert torch.equal(torch.ops.quantspec.gemm_grouped_x8(x[i : i + 1], *args)[0], y[i])
    variant = kernels.variant()
    use_variant("reference")
    try:
        assert torch.equal(torch.ops.quantspec.gemm_grouped_x8(x, *args), y)
    finally:
        use_variant(variant)


@pytest.mark.parametrize("format", ["w4a16", "w5a16", "w2a16"])
def test_a_grouped_modules_int8_prefill_is_the_kernel_or_the_same_products_in_fp32(isa, format):
    """prefill_activations=int8 on a module: the kernels' GEMM where the variant has one, else the fp32 fallback,
    both the block-rounded x times the weight (w2a16 has no int8 GEMM on any SIMD variant: the fallback)."""
    from src.quant.linear import install_prefill_activations

    bits = formats.get(format).bits
    torch.manual_seed(bits)
    x, w = torch.randn(kernels.MAX_ROWS + 3, 256).bfloat16(), torch.randn(40, 256)
    t = formats.get(format).tensors(w, None, 128)
    module = build(format, t, 128, torch.bfloat16, gemv=True)
    bf16 = module(x)
    counts = install_prefill_activations(torch.nn.Sequential(module), "int8")
    own = torch.ops.quantspec.has_gemm_grouped_x8(format_number(format))
    assert counts == {("kernels" if own else "torch"): 1}
    y = module._prefill(x.contiguous())
    ref = _x8_reference(x) @ formats.get(format).dequantized(t, 128).double().t()
    assert y.dtype == torch.float32 and _rel_err(y, ref) < 1e-5
    assert torch.equal(module(x), y.bfloat16())  # the module's output: the prefill's, rounded to x's dtype
    assert not torch.equal(module(x), bf16)  # a different arithmetic from the bf16 GEMM's (x rounded to int8)
    assert torch.equal(module(x[:2]), build(format, t, 128, torch.bfloat16, gemv=True)(x[:2]))  # a step: int16 x


@pytest.mark.parametrize("bits", sorted(SPLIT))
def test_a_split_width_packs_its_low_bits_then_its_high_bits_each_in_the_lane_layout(bits):
    # w6a16's 96 bytes per 128 values: the low 4 bits as w4a16's 64 bytes, then the high 2 as w2a16's 32;
    # w5a16's 80: the same 64, then the high bit's 16
    low, high = SPLIT[bits]
    torch.manual_seed(1)
    q = torch.randint(0, 1 << bits, (3, 256), dtype=torch.uint8)
    packed = pack_lanes(q, bits).reshape(3, 2, 16 * bits)
    assert torch.equal(packed[..., : 16 * low].reshape(3, 32 * low), pack_lanes(q & ((1 << low) - 1), low))
    assert torch.equal(packed[..., 16 * low :].reshape(3, 32 * high), pack_lanes(q >> low, high))


def test_a_format_a_variant_has_no_kernel_for_runs_the_reference_variants():
    # core/avx2.cpp has no 2-bit unpacking of its own: the binding filled it from the reference variant at load
    # (without the fallback the call is refused in one line, as for a format no variant has)
    torch.manual_seed(0)
    q, scale, zero = qparams.int_groups(torch.randn(8, 256), 128, 2)
    offset = (zero - 2 * scale).contiguous()
    args = (pack_lanes(q, 2), scale.contiguous(), offset, 128, format_number("w2a16"))
    here = torch.ops.quantspec.dequant_grouped(*args)
    use_variant("reference")
    assert torch.equal(here, torch.ops.quantspec.dequant_grouped(*args))
    with pytest.raises(RuntimeError, match="format 99 has no grouped kernel"):
        torch.ops.quantspec.dequant_grouped(*args[:4], 99)


@pytest.mark.parametrize("m,n,k,group", [(*s, 128) for s in SHAPES if s[2] % 128 == 0] + [(3, 20, 512, 256)])
def test_gemv_w4a8_is_exact_integer_sums_of_int8_activations_and_the_nibbles(m, n, k, group):
    # The reference rounds x per token to int8 as the kernel does (qparams.int8_per_token), then sums in float64:
    # the integer sums are exact, so only the per-group float scaling differs.
    torch.manual_seed(m * 5 + n)
    x, w = torch.randn(m, k).bfloat16(), torch.randn(n, k)
    q, scale, zero = qparams.int4_groups(w, group)
    offset = (zero - qparams.INT4_MID * scale).contiguous()
    y = torch.ops.quantspec.gemv_w4a8(x, pack_lanes(q, 4), scale.contiguous(), offset, group)
    x_q, x_scale = qparams.int8_per_token(x)
    ref = (x_q.double() @ qparams.int4_dequant(q, scale, zero, group).double().t()) * x_scale.double()
    assert y.dtype == torch.bfloat16 and _rel_err(y, ref) < 8e-3  # the output rounded to bf16, as x's dtype
    y32 = torch.ops.quantspec.gemv_w4a8(x.float(), pack_lanes(q, 4), scale.contiguous(), offset, group)
    assert _rel_err(y32, ref) < 1e-5
    # the int8 activations are what the kernel used: bf16 x's own product is farther than the rounding above
    assert _rel_err(x.double() @ qparams.int4_dequant(q, scale, zero, group).double().t(), ref) > 1e-3


def test_w4a8_prefills_quantizer_and_rescale_are_atens_ops_bit_for_bit():
    torch.manual_seed(4)
    x = (torch.randn(37, 640) * torch.logspace(-3, 2, 640)).bfloat16()
    x[5] = 0  # an all-zero row: the scale's floor
    q, scale = torch.ops.quantspec.quantize_x8_bf16(x)
    ref_q, ref_scale = qparams.int8_per_token(x)
    assert q.dtype == torch.bfloat16 and torch.equal(q, ref_q.bfloat16()) and torch.equal(scale, ref_scale)
    y = torch.randn(37, 100).bfloat16()
    assert torch.equal(torch.ops.quantspec.scale_rows_bf16(y.clone(), scale), (y.float() * scale).bfloat16())


def test_w4a8_sums_at_their_worst_case():
    # |q_x| = 127 against nibbles of 15 over a whole group of 256: the largest int32 lane sum the kernel sees.
    k, group = 1024, 256
    x = torch.full((2, k), 3.0)
    x[1] = -3.0
    q = torch.full((4, k), 15, dtype=torch.uint8)
    scale, offset = torch.full((4, k // group), 0.5), torch.zeros(4, k // group)
    y = torch.ops.quantspec.gemv_w4a8(x, pack_lanes(q, 4), scale, offset, group)
    expect = torch.tensor([[3.0 * 15 * 0.5 * k] * 4, [-3.0 * 15 * 0.5 * k] * 4])
    torch.testing.assert_close(y, expect, rtol=1e-6, atol=0)


def test_int4_weight_unpacks_to_bf16_for_prefill_and_the_gemv_reads_it_unrounded():
    torch.manual_seed(5)
    w = torch.randn(24, 512)
    q, scale, zero = qparams.int4_groups(w, 256)
    offset = (zero - qparams.INT4_MID * scale).contiguous()
    dense = dequant_w4a16(pack_lanes(q, 4), scale.contiguous(), offset, 256)
    # q * scale + offset rounded once to float32 (the kernel's FMA; exact in float64 first), then to bf16
    ref = (q.double().reshape(24, 2, 256) * scale.double()[..., None] + offset.double()[..., None]).reshape(24, 512)
    assert dense.dtype == torch.bfloat16 and torch.equal(dense, ref.float().bfloat16())
    x = torch.zeros(1, 512)
    x[0, 300] = 1  # one input channel: the gemv returns that column of the weight, in float32
    torch.testing.assert_close(
        gemv_w4a16(x, pack_lanes(q, 4), scale.contiguous(), offset, 256)[0],
        ref[:, 300].float(),
        rtol=1e-6,
        atol=1e-6,
    )


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
        y = gemv_w4a16(x, pack_lanes(q, 4), scale.contiguous(), (zero - qparams.INT4_MID * scale).contiguous(), 128)
        dense = qparams.int4_dequant(q, scale, zero, 128).double()
    assert y.dtype == torch.float32
    assert _rel_err(y, x.double() @ dense.t()) < 2e-4
    assert _rel_err(x.bfloat16().double() @ dense.t(), x.double() @ dense.t()) > 5e-4  # what bf16 x would cost


def test_16_bit_activation_sums_cannot_overflow():
    # The worst case for int32 sums: every weight at 127 and every activation at the int16 limit, over a
    # K of many 4096-value spans (the kernel folds its int32 sums into fp32 once per span).
    k = 16384
    x, w_q = torch.full((1, k), 3.0), torch.full((8, k), 127, dtype=torch.int8)
    y = torch.ops.quantspec.gemv_w8a16(x, w_q, torch.full((8,), 0.5))
    torch.testing.assert_close(y, torch.full((1, 8), 3.0 * 127 * 0.5 * k), rtol=1e-5, atol=0)  # fp32 rounding only
    q = torch.full((8, k), 15, dtype=torch.uint8)
    y = gemv_w4a16(x, pack_lanes(q, 4), torch.full((8, k // 128), 0.5), torch.zeros(8, k // 128), 128)
    torch.testing.assert_close(y, torch.full((1, 8), 3.0 * 15 * 0.5 * k), rtol=1e-5, atol=0)  # fp32 rounding only


def test_gemv_rejects_a_k_it_cannot_step_through():
    with pytest.raises(RuntimeError, match="multiple of"):
        torch.ops.quantspec.gemv_float(torch.randn(1, 40), torch.randn(8, 40))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("norm_cls,gemma", [(Gemma3RMSNorm, True), (LlamaRMSNorm, False)])
@pytest.mark.parametrize("d", [96, 100])  # 100: a sum of squares' tail after its 16 running sums
def test_fused_rms_norm_matches_transformers(norm_cls, gemma, dtype, d):
    torch.manual_seed(0)
    norm = norm_cls(d, eps=1e-6)
    with torch.no_grad():
        norm.weight.normal_()
    norm = norm.to(dtype)
    x = torch.randn(3, 5, d).to(dtype)
    fused = modules.FusedRMSNorm(norm, gemma)
    torch.testing.assert_close(fused(x), norm(x), rtol=1e-5 if dtype == torch.float32 else 1e-2, atol=1e-5)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_decode_attention_matches_causal_sdpa_and_each_row_stands_alone(dtype):
    torch.manual_seed(0)
    heads, kv_heads, queries, length, dim = 4, 2, 5, 40, 32
    q = torch.randn(1, heads, queries, dim).to(dtype)
    k, v = (torch.randn(1, kv_heads, length, dim).to(dtype) for _ in range(2))
    visible = torch.arange(length)[None, :] <= torch.arange(length - queries, length)[:, None]
    ref = torch.nn.functional.scaled_dot_product_attention(
        q.double(), k.double(), v.double(), attn_mask=visible, scale=0.2, enable_gqa=True
    )
    out = torch.ops.quantspec.decode_attention(q, k, v, 0.2)
    assert _rel_err(out, ref) < (1e-6 if dtype == torch.float32 else 1e-2)
    for i in range(queries):  # bit for bit what a one-query step over the shorter cache gives
        alone = torch.ops.quantspec.decode_attention(
            q[:, :, i : i + 1], k[:, :, : length - queries + i + 1], v[:, :, : length - queries + i + 1], 0.2
        )
        assert torch.equal(alone[:, :, 0], out[:, :, i])


def test_quantized_modules_built_for_the_gemv_take_it_for_few_rows_only():
    torch.manual_seed(1)
    w = torch.randn(48, 128)
    for kind, tensors, dtype in (
        ("w8a8", int8_tensors(w, None), torch.float32),
        ("w4a16", int4_tensors(w, None, 128), torch.bfloat16),
        ("w4a8", int4_tensors(w, None, 128), torch.bfloat16),
        ("w8a16", int8_tensors(w, None), torch.bfloat16),
    ):
        aten, fast = (build(kind, tensors, 128, dtype, gemv) for gemv in (False, True))
        assert type(fast).__name__.endswith("Gemv") and not type(aten).__name__.endswith("Gemv")
        x = torch.randn(2, 3, 128).to(dtype)
        assert _rel_err(fast(x), aten(x).double()) < 1e-2  # both round to bf16 (w4a16) differently
        many = torch.randn(1, 20, 128).to(dtype)  # more rows than MAX_ROWS: a prefill
        if kind in ("w4a16", "w4a8"):  # the weight unpacked to bf16 as the gemv does, one GEMM: no ATen int4 copy
            assert not hasattr(fast, "packed")
            assert _rel_err(fast(many), aten(many).double()) < 1e-2
        else:  # ATen's path, unchanged
            torch.testing.assert_close(fast(many), aten(many), rtol=0, atol=0)
        cut = fast.select_rows(torch.tensor([0, 5])) if hasattr(fast, "select_rows") else None
        assert cut is None or type(cut) is type(fast)  # a draft's cut head stays on the same kernels
    assert (
        type(build("w8a8", int8_tensors(torch.randn(8, 96), None), None, torch.float32, True)).__name__ == "W8A8Linear"
    )  # K = 96 is no multiple of the w8a8 kernel's 64: ATen's
    assert (
        type(build("w4a16", int4_tensors(w, None, 64), 64, torch.bfloat16, True)).__name__ == "W4A16Linear"
    )  # groups of 64 split the int4 kernel's 128-value loads: ATen's


def test_a_grouped_gemv_module_reads_its_stored_lanes_in_place():
    """The cache stores grouped weights in the kernels' lane layout: the module keeps the tensor it is given (for a
    cached model, a view of the mapped file), with no copy or repacking, and computes with the weights stored."""
    torch.manual_seed(9)
    w, x = torch.randn(96, 256), torch.randn(1, 256).bfloat16()
    for name, bits in (("w4a16", 4), ("w5a16", 5), ("w6a16", 6), ("w2a16", 2)):
        fmt = formats.get(name)
        tensors = fmt.tensors(w, None, 128)
        module = build(name, tensors, 128, torch.bfloat16, True)
        assert module.wg.data_ptr() == tensors[f"lanes{bits}"].data_ptr(), name
        ref = x.double() @ fmt.dequantized(tensors, 128).double().t()
        assert _rel_err(module(x), ref) < 1e-2, name


def test_a_rounded_weight_is_what_the_quantized_linears_prefill_multiplies_by():
    # the calibration windows go on through a rounded layer with this weight (src.quant.stream): the kernels'
    # unpacking where they are loaded, within a bf16 rounding of the weight's own float values
    torch.manual_seed(9)
    w = torch.randn(96, 256)
    for name in ("w4a16", "w5a16", "w6a16", "w2a16"):
        fmt = formats.get(name)
        tensors = fmt.tensors(w, None, 128)
        weight = fmt.rounded_weight(tensors, 128, torch.bfloat16)
        assert torch.equal(weight, build(name, tensors, 128, torch.bfloat16, True).unpacked()), name
        exact = fmt.dequantized(tensors, 128)
        assert ((weight.float() - exact).abs() <= exact.abs() * 2**-8 + 1e-6).all(), name


def test_a_prefills_bf16_gemm_made_fp32_multiplies_the_same_values():
    """float_gemm="fp32" (src.quant.prefill's choice where ATen's bf16 GEMM is slow): the same bf16 operands,
    made fp32 exactly, summed in fp32, the result rounded once to bf16, as the bf16 GEMM's is."""
    torch.manual_seed(6)
    w = torch.randn(200, 256)
    many = torch.randn(2, 65, 256).bfloat16()  # 130 rows: past w8a16's GEMM_ROWS too
    flat = many.reshape(-1, 256).double()
    float_linear = modules.GemvLinear(torch.nn.Linear(256, 200, bias=False).bfloat16())
    grouped = build("w4a16", int4_tensors(w, None, 128), 128, torch.bfloat16, True)
    w8a16 = build("w8a16", int8_tensors(w, None), None, torch.bfloat16, True)
    dense = torch.ops.quantspec.dequant_grouped(  # the weight as the prefill multiplies it
        grouped.wg, grouped.wg_scale, grouped.wg_offset, 128, format_number("w4a16")
    )
    for module, weight in (
        (float_linear, float_linear.weight.double()),
        (grouped, dense.double()),
        (w8a16, w8a16.w_q.double() * w8a16.w_scale32.double()[:, None]),
    ):
        assert module.bf16_gemm and module.float_gemm == "bf16"
        ref = flat @ weight.t()
        in_bf16 = module(many)
        module.float_gemm = "fp32"
        in_fp32 = module(many)
        assert in_fp32.dtype == torch.bfloat16 and in_fp32.shape == (2, 65, 200)
        assert _rel_err(in_bf16.reshape(-1, 200), ref) < 1e-2, type(module).__name__
        assert _rel_err(in_fp32.reshape(-1, 200), ref) < 1e-2, type(module).__name__
        # summed in fp32 and rounded once to bf16: the float64 product's own rounding, but where fp32's sums
        # land a hair across a bf16 rounding boundary
        rounded = ref.float().bfloat16()
        assert (in_fp32.reshape(-1, 200) == rounded).double().mean() > 0.99, type(module).__name__
    w4a8 = build("w4a8", int4_tensors(w, None, 128), 128, torch.bfloat16, True)
    in_bf16 = w4a8(many)
    w4a8.float_gemm = "fp32"
    assert _rel_err(w4a8(many).reshape(-1, 200), in_bf16.reshape(-1, 200).double()) < 1e-2


def test_the_fp32_gemm_of_a_bf16_weight_goes_a_block_of_rows_at_a_time(monkeypatch):
    torch.manual_seed(7)
    x, w = torch.randn(20, 64).bfloat16(), torch.randn(200, 64).bfloat16()
    whole = torch.mm(x.float(), w.float().t())
    monkeypatch.setattr(modules, "FP32_BLOCK_BYTES", 1)  # blocks of 64 rows: 64, 64, 64, 8
    torch.testing.assert_close(modules.many_rows_mm(x, w, "fp32"), whole, rtol=1e-6, atol=1e-6)
    assert modules.many_rows_mm(x, w, "bf16").dtype == torch.bfloat16
    q = torch.randint(-127, 128, (200, 64), dtype=torch.int8)  # w8a16's weight, made fp32 block by block
    torch.testing.assert_close(modules.many_rows_mm(x, q, "fp32"), x.float() @ q.float().t(), rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("arch", ARCHS)
def test_installed_kernels_keep_greedy_output_and_tie_the_head(arch):
    model, tok = tiny_model(arch)
    ids = tok("def add(a, b):", return_tensors="pt").input_ids
    before = GENERATE["hf"](model, Request(ids, 16, True, Sampling(), tok.pad_token_id))
    linears = sum(isinstance(m, torch.nn.Linear) for m in model.modules())
    counts = modules.install(model)
    assert counts["gemv_float32"] == linears  # every projection and the head
    if families.get(arch).norm != "layer":
        assert counts["fused_rms_norm"] > 0
    if model.config.tie_word_embeddings:
        assert model.lm_head.weight is model.get_input_embeddings().weight
    native = GENERATE["native"](model, Request(ids, 16, True, Sampling(), tok.pad_token_id))
    hf = GENERATE["hf"](model, Request(ids, 16, True, Sampling(), tok.pad_token_id))
    assert native.new_token_ids == hf.new_token_ids == before.new_token_ids


@pytest.mark.parametrize("arch", ARCHS)
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
        stepper, verifier = Decoder(model, "cpp"), Decoder(model, "cpp")
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
    head.focus([5, 6])  # a prompt's own tokens: the rows are cut again, from the swapped full head
    assert isinstance(head.head, modules.GemvLinear) and {5, 6} <= set(head.ids.tolist())


# --- every variant against the reference variant, and the invariants each must keep -----------------


def _ops(kind: str, m: int, seed: int = 0):
    """One op of each kind with its inputs (m rows), as a function of x alone."""
    g = torch.Generator().manual_seed(seed)
    k, n = 2176, 45  # 45: a tail of rows past the blocks of 4; 2176: w8a16's spans of 2048 and a part span
    x = torch.randn(m, k, generator=g) * torch.logspace(-1, 1, k)
    w = torch.randn(n, k, generator=g)
    if kind in ("f32", "bf16"):
        dtype = torch.float32 if kind == "f32" else torch.bfloat16
        wt = w.to(dtype)
        return x.to(dtype), lambda x: torch.ops.quantspec.gemv_float(x, wt)
    if kind in ("w8a8", "w8a16"):
        w_q, w_s = qparams.int8_per_channel(w)
        if kind == "w8a8":
            return x, lambda x: torch.ops.quantspec.gemv_w8a8(x, w_q, w_s, w_q.sum(1, dtype=torch.int32))
        return x, lambda x: torch.ops.quantspec.gemv_w8a16(x, w_q, w_s)
    q, scale, zero = qparams.int4_groups(w, 128)
    packed, offset = pack_lanes(q, 4), (zero - qparams.INT4_MID * scale).contiguous()
    gemv = gemv_w4a16 if kind == "w4a16" else torch.ops.quantspec.gemv_w4a8
    return x, lambda x: gemv(x, packed, scale.contiguous(), offset, 128)


GEMVS = ["f32", "bf16", "w8a8", "w8a16", "w4a16", "w4a8"]
# The integer formats' sums are exact on every variant: w8a8's one int32 sum is scaled in the same order
# everywhere (bit for bit); the 16-bit formats fold partial sums into fp32 at variant-specific points.
BOUND = {"f32": 1e-6, "bf16": 1e-6, "w8a8": 0.0, "w8a16": 1e-6, "w4a16": 1e-6, "w4a8": 1e-6}


@pytest.mark.parametrize("kind", GEMVS)
def test_each_variant_agrees_with_the_reference_variant(isa, kind):
    x, op = _ops(kind, 3)
    y = op(x)
    use_variant("reference")
    ref = op(x)
    err = float((y.double() - ref.double()).abs().max() / ref.double().abs().max())
    assert err <= BOUND[kind], f"{isa} vs reference: {err}"


@pytest.mark.parametrize("kind", GEMVS)
def test_a_rows_result_does_not_depend_on_how_many_rows_come_together(isa, kind):
    """On every variant this host runs; also each SIMD variant's one-row 4-bit path (blocking.h one_row_groups) against
    its blocking for several rows."""
    x, op = _ops(kind, kernels.MAX_ROWS, seed=3)
    together = op(x)
    for m in range(1, kernels.MAX_ROWS + 1):  # every row count a step or a verification can bring
        assert torch.equal(op(x[:m]), together[:m]), f"{m} rows"
    for i in range(kernels.MAX_ROWS):
        assert torch.equal(op(x[i : i + 1])[0], together[i]), f"row {i} alone"


def test_the_int4_unpacking_and_the_norms_are_bit_for_bit_the_reference_variants(isa):
    torch.manual_seed(2)
    q, scale, zero = qparams.int4_groups(torch.randn(36, 768), 256)
    args = (pack_lanes(q, 4), scale.contiguous(), (zero - qparams.INT4_MID * scale).contiguous(), 256)
    # d = 100: the sum of squares' 16 running sums and the 4 values after them
    norms = [(torch.randn(5, d).to(t), torch.randn(d).to(t)) for d in (640, 100) for t in (torch.bfloat16, torch.float)]

    def outputs():
        return [dequant_w4a16(*args)] + [
            torch.ops.quantspec.rms_norm(x, w, 1e-6, g) for x, w in norms for g in (True, False)
        ]

    ours = outputs()
    use_variant("reference")
    assert all(torch.equal(a, b) for a, b in zip(ours, outputs()))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("dim", [16, 64, 256])
def test_attention_agrees_with_the_reference_variant(isa, dtype, dim):
    torch.manual_seed(dim)
    q = torch.randn(1, 4, 3, dim).to(dtype)
    k, v = (torch.randn(1, 1, 37, dim).to(dtype) for _ in range(2))
    out = torch.ops.quantspec.decode_attention(q, k, v, dim**-0.5)
    use_variant("reference")
    ref = torch.ops.quantspec.decode_attention(q, k, v, dim**-0.5)
    assert _rel_err(out, ref.double()) < (1e-5 if dtype == torch.float32 else 1e-2)


def test_w8a8_integer_sums_at_their_worst_case():
    # Every product at 127 * 127 (AVX2's VPMADDUBSW pairs reach 2 * 127 * 127, below int16's limit; an
    # unsigned x + 128 would saturate), of both signs, over a long K: exact int32 sums, fp32 scaling only.
    k = 16384
    w_q = torch.full((8, k), 127, dtype=torch.int8)
    w_q[1::2] = -127
    for sign in (1.0, -1.0):
        x = torch.full((1, k), sign * 2.0)
        y = torch.ops.quantspec.gemv_w8a8(x, w_q, torch.full((8,), 0.5), w_q.sum(1, dtype=torch.int32))
        expect = torch.tensor([sign * (1 if r % 2 == 0 else -1) * 127 * 127 * k * 0.5 * (2.0 / 127) for r in range(8)])
        torch.testing.assert_close(y[0], expect, rtol=1e-6, atol=0)


def _projections(kind: str, sizes: list[int], k: int = 256):
    torch.manual_seed(3)
    ws = [torch.randn(n, k) for n in sizes]
    if kind in ("f32", "bf16"):
        dtype = torch.float32 if kind == "f32" else torch.bfloat16
        return [
            modules.GemvLinear(
                torch.nn.Linear(k, n, bias=False)
                .to(dtype)
                .requires_grad_(False)
                .apply(lambda m, w=w: m.weight.copy_(w))
            )
            for n, w in zip(sizes, ws)
        ], dtype
    dtype = torch.float32 if kind == "w8a8" else torch.bfloat16
    tensors = [int4_tensors(w, None, 128) if kind in ("w4a16", "w4a8") else int8_tensors(w, None) for w in ws]
    return [build(kind, t, 128, dtype, True) for t in tensors], dtype


@pytest.mark.parametrize("kind", ["f32", "bf16", "w8a8", "w8a16", "w4a16", "w4a8"])
def test_fused_projections_give_each_part_bit_for_bit_and_hold_no_second_copy(kind):
    from src.engine.fused import Projection

    parts, dtype = _projections(kind, [64, 32, 32])
    x = torch.randn(3, 256).to(dtype)
    alone = [p(x) for p in parts]
    projection = Projection(parts)
    assert projection.kernel_calls == 1
    for y, ref in zip(projection(x), alone):
        assert torch.equal(y, ref)
    fused = projection.calls[0][0]
    for p in parts:  # the parts read views of the fused tensors, and still work alone (a prefill's calls)
        for name, t in p.named_buffers() if kind not in ("f32", "bf16") else p.named_parameters():
            assert t.untyped_storage().data_ptr() == getattr(fused, name).untyped_storage().data_ptr()
    many = torch.randn(20, 256).to(dtype)
    assert [tuple(y.shape) for y in projection(many)] == [(20, 64), (20, 32), (20, 32)]
    for y, p in zip(projection(x), parts):
        assert torch.equal(y, p(x))


def test_projections_of_mixed_kinds_fuse_the_runs_that_share_one():
    from src.engine.fused import Projection

    (q, k), _ = _projections("w4a16", [64, 32])
    (v,), _ = _projections("w8a16", [32])
    projection = Projection([q, k, v])  # w4a16's q and k, with v kept at 8 bits
    assert projection.kernel_calls == 2 and projection.calls[1][0] is v
    x = torch.randn(1, 256).to(torch.bfloat16)
    refs = [q(x), k(x), v(x)]
    assert all(torch.equal(a, b) for a, b in zip(projection(x), refs))


def test_the_bindings_flipped_transpose_is_torchs_flip_and_transpose():
    op = kernels.binding_op("flipped_transpose")
    src = torch.randn(70, 131, generator=torch.Generator().manual_seed(0))  # neither a multiple of the 64-wide tiles
    for t in (src, src.bfloat16()):
        assert torch.equal(op(t), t.flip(1).T.float().contiguous()), t.dtype


def test_awqs_clip_trial_in_the_binding_is_torchs_bit_for_bit(monkeypatch):
    """A job that loads quantspec's kernels scores AWQ's clip trials by the binding's clip_change (each weight's
    change, bit for bit as torch's ops give it, in bf16) and row_dots_bf16 (the error, summed in another order)."""
    from src.quant import awq

    torch.manual_seed(0)
    w = torch.randn(96, 512) * 0.02
    w[3, 5] = 0.5  # an outlier: a group where clipping matters
    wg = w.reshape(96, 4, 128).transpose(0, 1).contiguous()  # [G, r, g], as the search holds it
    low, high = torch.aminmax(wg, dim=-1)
    w_max = torch.maximum(-low, high)
    for bits in (2, 4, 5):
        for ratio in (1.0, 0.8, 0.5):
            clip = w_max * ratio
            d = kernels.binding_op("clip_change")(wg, clip, low, high, bits)
            assert torch.equal(d, awq._clipped_change(wg, clip, bits, low, high).to(torch.bfloat16)), (bits, ratio)
    y = torch.randn(4, 96, 128).bfloat16()
    dots = kernels.binding_op("row_dots_bf16")(y, d)
    torch.testing.assert_close(dots, (y.float() * d.float()).sum(-1), rtol=1e-5, atol=1e-9)
    x = torch.randn(512, 512)
    monkeypatch.setattr(awq.bf16math, "native", lambda: True)  # the bf16 trials, on any host
    fused = awq.search_clip(x, w, 128)
    monkeypatch.setattr(awq, "binding_op", lambda name: None)
    plain = awq.search_clip(x, w, 128)

    def error(clip):  # each (row, group)'s output error, in float64
        change = (qparams.fake_int4_weight(w, 128, clip) - w).double().reshape(96, 4, 128)
        return torch.einsum("tgk,rgk->rgt", x.double().reshape(512, 4, 128), change).pow(2).mean(-1)

    assert (fused != plain).float().mean() < 0.05  # another order of sums may break a near tie otherwise
    torch.testing.assert_close(error(fused), error(plain), rtol=1e-3, atol=1e-12)


@pytest.mark.parametrize("bits, group", [(8, None), (4, 128), (5, 128), (2, 128)])
def test_gptqs_run_of_features_in_the_binding_is_torchs_bit_for_bit(monkeypatch, bits, group):
    """A job that loads quantspec's kernels rounds GPTQ's features in the binding (gptq_features, its copies by
    flipped_transpose); any other in torch (src/quant/gptq.py's _features): the two give the same quantized
    weights, scales and zeros, so a cached entry does not depend on which made it."""
    from src.quant import gptq

    torch.manual_seed(0)
    w = torch.randn(300, 512) * 0.02  # 300 rows: runs of rows split unevenly across threads
    x = torch.randn(1024, 512)
    x[:, 7] = 0.0  # a feature never seen: zeroed, on both paths
    h = x.T @ x
    assert gptq.binding_op("gptq_features") is not None  # the binding is loaded (the fixture's variant)
    native = gptq.round_weights(w, h, bits, group)
    gptq.forget()
    monkeypatch.setattr(gptq, "binding_op", lambda name: None)  # its transposing copies in torch too
    torch_path = gptq.round_weights(w, h, bits, group)
    gptq.forget()
    for a, b in zip(native, torch_path, strict=True):
        assert (a is None and b is None) or torch.equal(a, b)
