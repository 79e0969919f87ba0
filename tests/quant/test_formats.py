"""The format registry (src/quant/formats.py): every registered weight format, with no list of them here, is
quantized, packed and run off quantspec's kernels against its fake-quant reference; a new format is tested by
being registered. (Its kernels: tests/kernels/test_kernels.py; the C++ step: tests/engine/test_cpp_step.py.)"""

import pytest
import torch
import torch.nn.functional as F

from src.models.tiny import tiny_model
from src.quant import formats, qparams
from src.quant.pipeline import install, quantize
from tests.support.quant import calib, quant_spec


@pytest.mark.parametrize("bits", range(1, 9))
def test_the_bit_stream_round_trips_at_every_width(bits):
    q = torch.randint(0, 1 << bits, (5, 256), dtype=torch.uint8)
    packed = qparams.pack_bits(q, bits)
    assert packed.shape == (5, 256 * bits // 8) and torch.equal(qparams.unpack_bits(packed, bits), q)


def test_the_bit_stream_runs_from_each_values_highest_bit():
    # at 6 bits four values fill three bytes: 0b101010, 0b000001, 0b111111, 0b010000
    q = torch.tensor([[0b101010, 0b000001, 0b111111, 0b010000, 0, 0, 0, 0]], dtype=torch.uint8)
    assert qparams.pack_bits(q, 6)[0, :3].tolist() == [0b10101000, 0b00011111, 0b11010000]
    assert qparams.pack_bits(q[:, :2] & 15, 4)[0, 0].item() == 0b10100001  # the first value in the high nibble


@pytest.mark.parametrize("bits", [1, 2, 4, 5, 6, 8])
def test_the_lane_layout_round_trips_at_every_width_it_holds(bits):
    gen = torch.Generator().manual_seed(bits)
    q = torch.randint(0, 1 << bits, (37, 384), generator=gen, dtype=torch.uint8)  # odd rows, three blocks
    packed = qparams.pack_lanes(q, bits)
    assert packed.shape == (37, 384 * bits // 8) and torch.equal(qparams.unpack_lanes(packed, bits), q)
    # a block of rows unpacks on its own (GroupedLinear unpacks a block of output channels at a time)
    assert torch.equal(qparams.unpack_lanes(packed[5:9], bits), q[5:9])


@pytest.mark.parametrize("bits", [2, 4, 5, 6])
def test_grouped_weights_are_stored_in_the_kernels_lanes_where_k_is_whole_blocks_and_as_a_bit_stream_where_not(bits):
    """The cache stores the lane layout the gemv kernels read in place; a width that is not whole blocks of 128
    (a tiny model's 64 features) as the bit stream, and each unpacks to the same values."""
    for k, field, pack in ((256, f"lanes{bits}", qparams.pack_lanes), (64, f"q{bits}", qparams.pack_bits)):
        q = torch.randint(0, 1 << bits, (6, k), dtype=torch.uint8)
        stored = qparams.pack_weights(q, bits)
        assert list(stored) == [field] and torch.equal(stored[field], pack(q, bits))
        packed, lanes = qparams.packed_weights(stored, bits)
        assert lanes == (k == 256) and torch.equal(qparams.unpack_weights(packed, bits, lanes), q)


@pytest.mark.parametrize("name", formats.names())
def test_each_format_off_quantspecs_kernels_computes_its_fake_quant_reference(name):
    fmt = formats.get(name)
    torch.manual_seed(3)
    w, b, x = torch.randn(40, 256), torch.randn(40), torch.randn(3, 256)
    module = formats.build(name, fmt.tensors(w, b, 128), 128, torch.bfloat16)
    assert isinstance(module, fmt.aten)
    if fmt.grouped:
        q, scale, zero = qparams.int_groups(w, 128, fmt.bits)
        ref_w = qparams.groups_dequant(q, scale, zero, 128, fmt.bits)
    else:
        ref_w = qparams.fake_int8_weight(w)
    ref_x = qparams.fake_int8_act(x.bfloat16().float()) if fmt.act_bits == 8 else x.bfloat16().float()
    ref = F.linear(ref_x, ref_w, b)
    out = module(x.bfloat16()).float()
    # bf16 weights, scales or outputs round on the way; the reference rounds only the input
    assert (out - ref).abs().max() / ref.abs().max() < 3e-2


def test_a_grouped_format_names_its_bits_and_the_validation_says_them():
    from src.common.schema import ConfigError

    assert {"w4a16", "w4a8", "w2a16"} <= set(formats.grouped()) and "w8a8" not in formats.grouped()
    with pytest.raises(ConfigError, match=r"^precision.format=w2a16 is a 2-bit format, which quantizes in groups"):
        quant_spec("rtn", "w2a16", group_size=None).validate()
    with pytest.raises(
        ConfigError, match="precision.method=smoothquant is for 8-bit kernels; use awq or rtn for w2a16"
    ):
        quant_spec("smoothquant", "w2a16", group_size=128, alpha=0.5).validate()


def test_awq_at_two_bits_quantizes_a_tiny_model_that_then_generates():
    model, tok = tiny_model("llama")
    spec = quant_spec("awq", "w2a16", group_size=128, awq_grid=4, awq_search_tokens=128, head_format="w8a16")
    weights = quantize(model, "llama", spec, calib(tok))
    assert {s for n, s in weights.format_of.items() if n != "lm_head"} == {"w2a16"}
    assert (
        qparams.packed_weights(weights.layers["model.layers.0.mlp.up_proj"], 2)[0].dtype == torch.uint8
    )  # four weights a byte
    model = install(model.to(torch.bfloat16), weights, torch.bfloat16)
    ids = tok("def add(a, b):", return_tensors="pt").input_ids
    out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=4, min_new_tokens=4, do_sample=False)
    assert out.shape[1] == ids.shape[1] + 4


def test_the_head_and_the_linears_kept_wider_take_the_six_bit_format_and_awq_clips_only_the_four_bit_ones():
    from src.common.schema import ConfigError

    model, tok = tiny_model("llama")
    spec = quant_spec(
        "awq",
        "w4a16",
        group_size=128,
        awq_grid=4,
        awq_search_tokens=128,
        head_format="w6a16",
        wide_linears=("mlp.down_proj", "self_attn.v_proj"),
        wide_format="w6a16",
    )
    spec.validate()
    weights = quantize(model, "llama", spec, calib(tok))
    clips = weights.info["clipped"]
    assert clips and not any(n.endswith(("down_proj", "v_proj")) for n in clips)  # clipped at 4 bits: not theirs
    wide = {n: s for n, s in weights.format_of.items() if n == "lm_head" or n.endswith(("down_proj", "v_proj"))}
    assert set(wide.values()) == {"w6a16"} and len(wide) == 1 + 2 * 2  # the head, two layers' two linears
    assert (
        qparams.packed_weights(weights.layers["model.layers.0.mlp.down_proj"], 6)[0].shape[1] == 256 * 6 // 8
    )  # four weights in 3 bytes
    assert weights.format_of["model.layers.0.mlp.up_proj"] == "w4a16"
    with pytest.raises(ConfigError, match=r"^precision.wide_format='w3a16' is not one of"):
        quant_spec("rtn", "w4a16", group_size=128, wide_format="w3a16").validate()
