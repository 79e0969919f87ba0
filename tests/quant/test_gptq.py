"""GPTQ's rounding (src/quant/gptq.py): on each scheme's own grid, round to nearest where the inputs are
uncorrelated, a smaller output error than round to nearest where they are not, and in the pipeline for the
linears precision.gptq names."""

import pytest
import torch

from src.common.schema import ConfigError
from src.models.tiny import tiny_model
from src.quant import gptq, qparams
from src.quant.pipeline import install, quantize
from tests.helpers import calib, quant_spec

CASES = [(8, None), (6, 128), (4, 128), (4, 32), (2, 64)]


def _rtn(w, bits, group):
    if group is None:
        return qparams.int8_per_channel(w) + (None,)
    return qparams.int_groups(w, group, bits)


def _dequant(q, scale, zero, bits, group):
    return q.float() * scale[:, None] if group is None else qparams.groups_dequant(q, scale, zero, group, bits)


@pytest.mark.parametrize(("bits", "group"), CASES)
def test_with_uncorrelated_inputs_gptq_is_round_to_nearest(bits, group):
    # a diagonal H has nothing to push an error onto: every weight keeps its own nearest value
    w = torch.randn(64, 256, generator=torch.Generator().manual_seed(bits))
    h = torch.diag(torch.rand(256, dtype=torch.float64) + 0.5)
    got, want = gptq.round_weights(w, h, bits, group), _rtn(w, bits, group)
    for a, b in zip(got, want, strict=True):
        if b is None:
            assert a is None
        elif a.dtype.is_floating_point:
            torch.testing.assert_close(a, b)
        else:
            assert a.dtype == b.dtype and torch.equal(a, b)


@pytest.mark.parametrize(("bits", "group"), CASES)
def test_with_correlated_inputs_gptq_lowers_the_layers_output_error(bits, group):
    g = torch.Generator().manual_seed(10 + bits)
    w = torch.randn(96, 256, generator=g)
    mix = torch.eye(256) + 0.3 * torch.randn(256, 256, generator=g)
    x = torch.randn(2048, 256, generator=g) @ mix  # features that move together, as a model's do
    q, scale, zero = gptq.round_weights(w, gptq.gram(x), bits, group)
    top = 127 if group is None else (1 << bits) - 1
    assert int(q.min()) >= (-127 if group is None else 0) and int(q.max()) <= top  # on the scheme's grid
    err = ((x @ (_dequant(q, scale, zero, bits, group) - w).T) ** 2).mean()
    rtn_err = ((x @ (_dequant(*_rtn(w, bits, group), bits, group) - w).T) ** 2).mean()
    assert err < 0.8 * rtn_err, (float(err), float(rtn_err))


def test_a_feature_the_calibration_never_saw_is_zeroed_and_the_rest_still_round():
    w = torch.randn(32, 128)
    x = torch.randn(512, 128)
    x[:, 5] = 0.0
    q, scale, zero = gptq.round_weights(w, gptq.gram(x), 4, 128)
    back = qparams.groups_dequant(q, scale, zero, 128, 4)
    assert back[:, 5].abs().max() <= scale.max() / 2 + 1e-6  # nearest grid value to 0
    assert torch.isfinite(back).all()


def test_precision_gptq_rounds_the_head_and_the_named_linears_and_refuses_a_name_that_matches_none():
    model, tok = tiny_model("llama")
    plain = quant_spec("rtn", "w4a16", group_size=128, head_scheme="w8a16", int8_linears=("self_attn.v_proj",))
    spec = quant_spec(
        "rtn",
        "w4a16",
        group_size=128,
        head_scheme="w8a16",
        int8_linears=("self_attn.v_proj",),
        gptq=("lm_head", "v_proj"),
    )
    assert spec.calibrates and not plain.calibrates  # GPTQ reads calibration inputs where RTN alone reads none
    ref = quantize(tiny_model("llama")[0], "llama", plain, None)
    weights = quantize(model, "llama", spec, calib(tok))
    assert weights.schemes == ref.schemes  # the same formats, other values
    for name in ("lm_head", "model.layers.0.self_attn.v_proj"):
        assert not torch.equal(weights.layers[name]["w_q"], ref.layers[name]["w_q"]), name
    for name in ("model.layers.0.mlp.up_proj", "model.layers.1.self_attn.q_proj"):  # not named: to nearest
        assert torch.equal(weights.layers[name]["q4"], ref.layers[name]["q4"]), name
    model = install(model.to(torch.bfloat16), weights, torch.bfloat16)
    ids = tok("def add(a, b):", return_tensors="pt").input_ids
    out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=4, min_new_tokens=4, do_sample=False)
    assert out.shape[1] == ids.shape[1] + 4
    bad = quant_spec("rtn", "w4a16", group_size=128, gptq=("lm_hed",))
    with pytest.raises(ConfigError, match=r"^precision.gptq=\['lm_hed'\]: lm_hed names no linear"):
        quantize(tiny_model("llama")[0], "llama", bad, calib(tok))
