"""The quantized modules off the CPU (hardware=cuda): built from the same portable tensors as on the CPU, each
of their paths run here against the reference dequantization where it is device-independent arithmetic, and
the CUDA layouts checked through torch's meta kernels (the shapes and dtypes its CUDA ops take and give).
What only a GPU shows (tinygemm's and _int_mm's numbers on the device) is scripts/bench_gpu's."""

import pytest
import torch
import torch.nn.functional as F

from src.quant import aten_ops, qparams
from src.quant.formats import build
from src.quant.linear import W4A16Linear, W8A8Linear, W8A16Linear, int4_tensors, int8_tensors


@pytest.fixture
def layer():
    torch.manual_seed(0)
    return torch.randn(259, 256), torch.randn(259)


@pytest.mark.parametrize("rows", [1, 5, 23, 24, 40])
def test_w8a8_off_the_cpu_matches_the_reference_on_both_row_paths(layer, rows):
    w, _ = layer
    w_q, w_scale = qparams.int8_per_channel(w)
    x = torch.randn(rows, 256)
    ref = F.linear(qparams.fake_int8_act(x), qparams.fake_int8_weight(w))
    # fewer than 24 rows are padded for _int_mm (CUDA's takes more than 16), and sliced back
    torch.testing.assert_close(aten_ops.int8_matmul(x, w_q, w_scale), ref, rtol=1e-5, atol=1e-4)


def test_w8a16_without_the_int8_weight_kernel_falls_back_once_and_matches_it(layer, monkeypatch):
    w, _ = layer
    w_q, w_scale = qparams.int8_per_channel(w)
    x = torch.randn(3, 256).bfloat16()
    kernel = aten_ops.int8_weight_matmul(x, w_q, w_scale.bfloat16())
    ref = F.linear(x.float(), qparams.fake_int8_weight(w))
    torch.testing.assert_close(kernel.float(), ref, rtol=2e-2, atol=0.15)
    tried = []

    def missing(*args):  # a device whose torch has no int8-weight kernel
        tried.append(1)
        raise NotImplementedError("no kernel for this backend")

    monkeypatch.setattr(torch, "_weight_int8pack_mm", missing)
    monkeypatch.setattr(aten_ops, "_int8pack", {})
    first = aten_ops.int8_weight_matmul(x, w_q, w_scale.bfloat16())
    second = aten_ops.int8_weight_matmul(x, w_q, w_scale.bfloat16())
    assert tried == [1] and aten_ops._int8pack == {"cpu": False}  # asked once, remembered
    torch.testing.assert_close(first.float(), kernel.float(), rtol=2e-2, atol=0.15)
    assert torch.equal(first, second)


def test_tinygemm_takes_quantspecs_stored_values_and_zero_point(layer):
    w, b = layer
    q, scale, zero = qparams.int4_groups(w, 128)
    stored = qparams.stored_values(int4_tensors(w, b, 128), 4)
    # CUDA's converter takes uint8 [N, K/2], even columns in the high nibble, made from the stored values
    nibbles = qparams.pack_nibbles(stored)
    assert torch.equal(stored, q) and torch.equal(nibbles[:, 0] >> 4, q[:, 0].to(torch.uint8))
    # tinygemm's dequantization is (q - 8) * scale + zero, quantspec's reference
    torch.testing.assert_close(
        qparams.int4_dequant(q, scale, zero, 128),
        ((q.float() - 8).reshape(259, 2, 128) * scale[..., None] + zero[..., None]).reshape(259, 256),
    )
    assert [aten_ops.inner_k_tiles(k) for k in (4096, 11008, 96)] == [8, 8, 2]
    with pytest.raises(ValueError, match="multiple of 32"):
        aten_ops.inner_k_tiles(40)


def test_modules_built_for_another_device_take_its_layouts(layer):
    """On the meta device (torch's shape functions for the CUDA ops): the int4 module holds the CUDA layout,
    [N/8, K/(16 * inner tiles), 32, inner tiles / 2] int32 from N padded to 16, and every module's tensors
    are on the device it was built for."""
    w, b = layer
    w4 = build("w4a16", int4_tensors(w, b, 128), 128, torch.bfloat16, device="meta")
    assert isinstance(w4, W4A16Linear) and w4.packed.shape == (272 // 8, 256 // 128, 32, 4)
    assert w4.packed.dtype == torch.int32 and w4.scales_zeros.shape == (2, 272, 2)
    for kind, cls in (("w8a8", W8A8Linear), ("w8a16", W8A16Linear)):
        module = build(kind, int8_tensors(w, b), None, torch.bfloat16, gemv=True, device="meta")
        assert type(module) is cls and module.w_q.device.type == "meta"  # no CPU gemv module off the CPU
