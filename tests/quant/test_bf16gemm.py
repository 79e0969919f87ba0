"""Quantization's bf16 GEMMs (src/quant/bf16gemm.py) on the avx512 kernels' gemm_bf16 (VDPBF16PS): a Gram's upper
triangle and GPTQ's block updates, against float64 products of the same bf16 values, and GPTQ with them against
GPTQ in float32. Where the CPU lacks AVX512-BF16 the kernels have none and the callers keep torch's float32 GEMMs
(the other tests of src/quant run that path)."""

import pytest
import torch

from src.quant import bf16gemm, gptq, qparams
from tests.support.kernels import use_variant


@pytest.fixture(autouse=True)
def avx512():
    return use_variant("avx512")


def _rel_err(y: torch.Tensor, ref: torch.Tensor) -> float:
    return float((y.double() - ref).abs().max() / ref.abs().max())


# exact products summed in float32: ~1e-6 of the largest sum here, where operands rounded to bf16 would be ~1e-3
EXACT = 1e-5


def test_a_gram_is_its_upper_triangle_of_exact_products_summed_in_float32():
    assert bf16gemm.native()
    torch.manual_seed(0)
    # odd token counts (a zero pair), widths off the 8-row tiles and 32-column panels, rows split across threads
    for t, k in [(37, 45), (64, 96), (301, 333)]:
        x = torch.randn(t, k).to(torch.bfloat16)
        g = bf16gemm.gram_upper(x)
        assert torch.equal(g.tril(-1), torch.zeros_like(g))  # below the diagonal: zero, gptq.gram's contract
        assert _rel_err(g, (x.double().T @ x.double()).triu()) < EXACT
        assert torch.equal(gptq.gram(x.flip(1)), g)  # GPTQ's Grams of bf16 rows, here (in its order: reversed)


def test_an_update_adds_the_product_of_the_operands_bf16_values_in_place():
    torch.manual_seed(1)
    for m, k, n in [(13, 7, 50), (100, 128, 300)]:
        c, a, b = torch.randn(m, n), torch.randn(m, k), torch.randn(k, n)
        ref = c.double() + a.to(torch.bfloat16).double() @ b.to(torch.bfloat16).double()
        assert _rel_err(bf16gemm.addmm_(c, a, b), ref) < EXACT
    # A a block of a larger matrix (rows far apart), C a block of rows of another: GPTQ's block update
    big, wt, err = torch.randn(200, 256), torch.randn(300, 64), torch.randn(128, 64)
    ref = wt.double()
    ref[:100] += big[:100, 128:].to(torch.bfloat16).double() @ err.to(torch.bfloat16).double()
    bf16gemm.addmm_(wt[:100], big[:100, 128:], err)
    assert _rel_err(wt, ref) < EXACT and torch.equal(wt[100:], ref[100:].float())  # the rows past the block kept


def test_blocks_packed_apart_and_joined_are_the_whole_packed():
    # GPTQ packs each block's errors once, and joins a run's blocks for the run's update
    b = torch.randn(512, 70)
    parts = [bf16gemm.panels(b[i : i + 128]) for i in range(0, 512, 128)]
    assert torch.equal(bf16gemm.joined(parts), bf16gemm.panels(b))


@pytest.mark.parametrize(("bits", "group"), [(8, None), (4, 128)])
def test_gptq_with_bf16_updates_has_float32_gptqs_output_error(monkeypatch, bits, group):
    # the factor's and errors' values rounded by 2^-9 of themselves: a weight near a half-step rounds the other way
    # and GPTQ sends that on (measured: 2-4% of the weights one step apart), the layer's output error GPTQ's own
    g = torch.Generator().manual_seed(3)
    w = torch.randn(256, 768, generator=g) * 0.02
    x = torch.randn(2048, 768, generator=g) @ (torch.eye(768) + 0.2 * torch.randn(768, 768, generator=g))
    h = gptq.gram(x)

    def rounded():
        out = gptq.round_weights(w, h, bits, group)
        gptq.forget()
        return out

    def output_error(q, scale, zero):
        back = q.float() * scale[:, None] if group is None else qparams.groups_dequant(q, scale, zero, group, bits)
        return float(((x @ (back - w).T) ** 2).mean())

    ours = rounded()
    monkeypatch.setattr(bf16gemm, "native", lambda: False)
    fp32 = rounded()
    rtn = qparams.int8_per_channel(w) + (None,) if group is None else qparams.int_groups(w, group, bits)
    assert (ours[0] == fp32[0]).float().mean() > 0.9
    assert output_error(*ours) < 1.01 * output_error(*fp32) < 0.6 * output_error(*rtn)
