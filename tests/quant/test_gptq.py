"""GPTQ's rounding (src/quant/gptq.py): on each format's own grid, round to nearest where the inputs are
uncorrelated, a smaller output error than round to nearest where they are not, and in the pipeline for the
linears precision.gptq names."""

import pytest
import torch

from src.common.schema import ConfigError
from src.models.tiny import tiny_model
from src.quant import bf16gemm, gptq, qparams, stream
from src.quant.pipeline import install, quantize
from tests.support.quant import calib, quant_spec

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
    assert int(q.min()) >= (-127 if group is None else 0) and int(q.max()) <= top  # on the format's grid
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
    plain = quant_spec("rtn", "w4a16", group_size=128, head_format="w8a16", wide_linears=("self_attn.v_proj",))
    spec = quant_spec(
        "rtn",
        "w4a16",
        group_size=128,
        head_format="w8a16",
        wide_linears=("self_attn.v_proj",),
        gptq=("lm_head", "v_proj"),
    )
    assert spec.calibrates and not plain.calibrates  # GPTQ reads calibration inputs where RTN alone reads none
    ref = quantize(tiny_model("llama")[0], "llama", plain, None)
    weights = quantize(model, "llama", spec, calib(tok))
    assert weights.format_of == ref.format_of  # the same formats, other values
    for name in ("lm_head", "model.layers.0.self_attn.v_proj"):
        assert not torch.equal(weights.layers[name]["w_q"], ref.layers[name]["w_q"]), name
    for name in ("model.layers.0.mlp.up_proj", "model.layers.1.self_attn.q_proj"):  # not named: to nearest
        assert torch.equal(weights.layers[name]["lanes4"], ref.layers[name]["lanes4"]), name
    model = install(model.to(torch.bfloat16), weights, torch.bfloat16)
    ids = tok("def add(a, b):", return_tensors="pt").input_ids
    out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=4, min_new_tokens=4, do_sample=False)
    assert out.shape[1] == ids.shape[1] + 4
    bad = quant_spec("rtn", "w4a16", group_size=128, gptq=("lm_hed",))
    with pytest.raises(ConfigError, match=r"^precision.gptq=\['lm_hed'\]: lm_hed names no linear"):
        quantize(tiny_model("llama")[0], "llama", bad, calib(tok))


def test_gptq_wide_false_leaves_the_wide_linears_to_round_to_nearest():
    # w4a16's mix: every linear named (*), the wide ones (5 bits) to nearest, the 4-bit ones and the head by GPTQ
    model, tok = tiny_model("llama")
    fields = dict(group_size=128, head_format="w5a16", wide_linears=("mlp.down_proj",), wide_format="w5a16")
    plain = quant_spec("rtn", "w4a16", **fields)
    spec = quant_spec("rtn", "w4a16", gptq=("*",), gptq_wide=False, **fields)
    linears = stream.quantized_linears(model, "llama", spec)
    chosen = stream.gptq_linears(linears, spec)
    assert chosen == {n for n in linears if not n.endswith("mlp.down_proj")} and "lm_head" in chosen
    ref = quantize(tiny_model("llama")[0], "llama", plain, None)
    weights = quantize(model, "llama", spec, calib(tok))
    for name in ("model.layers.0.mlp.down_proj", "model.layers.1.mlp.down_proj"):
        assert all(torch.equal(weights.layers[name][f], ref.layers[name][f]) for f in ref.layers[name]), name
    for name in ("lm_head", "model.layers.0.mlp.up_proj"):
        assert not all(torch.equal(weights.layers[name][f], ref.layers[name][f]) for f in ref.layers[name]), name


def _reference_gptq(w, h, bits, group):
    """GPTQ as its paper writes it, in float64: H damped, U the upper Cholesky factor of H^-1, each feature rounded in
    turn (a group ranged at its first feature) and its error (w_i - q_i) / U_ii sent to every later feature by U_ij."""
    w, h = w.double().clone(), h.double().clone()
    h.diagonal().add_(gptq.DAMP * h.diagonal().mean())
    u = torch.linalg.cholesky(torch.cholesky_inverse(torch.linalg.cholesky(h)), upper=True)
    n, k = w.shape
    top = (1 << bits) - 1
    q = torch.empty(n, k)
    for i in range(k):
        if i % group == 0:
            span = w[:, i : i + group]
            lo, hi = span.amin(dim=1), span.amax(dim=1)
            step = ((hi - lo) / top).clamp(min=1e-6)
        qi = torch.round((w[:, i] - lo) / step).clamp(0, top)
        q[:, i] = qi
        e = (w[:, i] - (qi * step + lo)) / u[i, i]
        w[:, i + 1 :] -= e[:, None] * u[i, i + 1 :][None, :]
    return q


@pytest.mark.parametrize("run", [gptq.SUPER, 256])  # one run of features, or two (the second's errors sent on)
def test_the_rounding_is_gptqs_own_to_float32s_rounding(monkeypatch, run):
    # the one-factor form (H's own Cholesky factor on the features held reversed, the original weights' errors,
    # groups ranged as the reference holds them, lazy batches at three levels) against the paper's three-factor form at
    # float64, feature by feature: the same grid values, but for any a float32 rounding moves across a half-step (and
    # what those send on; none here). Ranged from the one-factor form's own partial sums, 17% of them had differed.
    g = torch.Generator().manual_seed(7)
    w = torch.randn(48, 384, generator=g)
    x = torch.randn(1024, 384, generator=g) @ (torch.eye(384) + 0.2 * torch.randn(384, 384, generator=g))
    h = gptq.gram(x)  # its upper triangle (syrk's) in GPTQ's order, the features reversed: all GPTQ reads
    assert torch.equal(h.tril(-1), torch.zeros_like(h)) and h.is_contiguous()
    torch.testing.assert_close(h, (x.T @ x).flip(0, 1).triu(), rtol=1e-5, atol=1e-2)
    # GPTQ's float32 updates, whatever kernels this process has loaded (bf16 ones: tests/quant/test_bf16gemm.py)
    monkeypatch.setattr(bf16gemm, "native", lambda: False)
    monkeypatch.setattr(gptq, "SUPER", run)
    q, _, _ = gptq.round_weights(w, h, 4, 128)
    gptq.forget()
    full = (h + h.triu(1).T).flip(0, 1)  # H in the features' own order
    same = (q.float() == _reference_gptq(w, full, 4, 128)).float().mean()
    assert same > 0.995, float(same)
