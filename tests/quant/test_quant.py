"""Quantization on tiny models: exact smoothing, kernels against fake-quant references, the cache."""

import pytest
import torch
import torch.nn.functional as F

from src.models import families
from src.models.tiny import tiny_model
from src.quant import awq, qparams, scaling, smoothquant, stream
from src.quant.apply import quantize_model
from src.quant.arch import awq_groups, decoder_layers, decoder_linears, layer_prefix, layer_smooth_groups
from src.quant.formats import build
from src.quant.linear import W4A16Linear, W8A8Linear, W8A16Linear, int4_tensors, int8_tensors
from src.quant.pipeline import install, quantize
from tests.support.quant import calib, quant_spec

ARCHS = families.NAMES  # every family src.models.families describes: a new one is tested here by its file alone
SPECS = {
    "w8a8": quant_spec("smoothquant", "w8a8", alpha=0.5),
    "w8a16": quant_spec("smoothquant", "w8a16", alpha=0.5),
    "w4a16": quant_spec("awq", "w4a16", group_size=128, awq_grid=5, awq_search_tokens=256),
    "rtn": quant_spec("rtn", "w4a16", group_size=128),
    "w4a8": quant_spec("awq", "w4a8", group_size=128, awq_grid=5, awq_search_tokens=256),
}
DTYPE = {
    "w8a8": torch.float32,
    "w8a16": torch.bfloat16,
    "w4a16": torch.bfloat16,
    "rtn": torch.bfloat16,
    "w4a8": torch.bfloat16,
}


def logits(model, ids):
    with torch.inference_mode():
        return model(input_ids=ids).logits.float()


@pytest.mark.parametrize("arch", ARCHS)
def test_smoothing_alone_leaves_fp32_logits_unchanged(arch):
    model, tok = tiny_model(arch)
    ids = calib(tok, 1)[0:1]
    before = logits(model, ids)
    layers = decoder_layers(model, arch)
    hidden, calls = stream.entry(model, layers, calib(tok))
    changed = set()
    with torch.no_grad():
        for i, layer in enumerate(layers):  # each layer smoothed by what its forward met, then run on
            mine = {n: m for n, m in decoder_linears(model, arch).items() if n.startswith(layer_prefix(arch, i))}
            seen = stream.observe(layer, mine, hidden, *calls[i], stream.Wants(absmax=True))
            changed |= smoothquant.smooth_layer(layer_smooth_groups(model, arch, i), seen, alpha=0.85).changed
            hidden = [stream.layer_hidden(layer(h, *calls[i][0], **calls[i][1])) for h in hidden]
    assert changed  # it did move something
    torch.testing.assert_close(logits(model, ids), before, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("arch", ARCHS)
def test_awq_scaling_alone_leaves_fp32_logits_unchanged(arch):
    model, tok = tiny_model(arch)
    ids = calib(tok, 1)[0:1]
    before = logits(model, ids)
    gen = torch.Generator().manual_seed(0)
    for g in awq_groups(model, arch):
        scaling.apply(g, torch.rand(g.linears[0].in_features, generator=gen) + 0.5)
    torch.testing.assert_close(logits(model, ids), before, rtol=1e-4, atol=1e-4)


@pytest.fixture
def layer():
    torch.manual_seed(0)
    # 259 outputs: not a multiple of 16, so the int4 module's padding is exercised too
    return torch.randn(259, 256), torch.randn(259), torch.randn(3, 5, 256)


def test_w8a8_kernel_matches_its_reference(layer):
    w, b, x = layer
    module = build("w8a8", int8_tensors(w, b), None, torch.float32)
    ref = F.linear(qparams.fake_int8_act(x.reshape(-1, 256)), qparams.fake_int8_weight(w), b).reshape(3, 5, 259)
    torch.testing.assert_close(module(x), ref, rtol=1e-5, atol=1e-4)
    assert isinstance(module, W8A8Linear) and module.w_q.dtype == torch.int8


def test_w8a16_kernel_matches_its_reference(layer):
    w, b, x = layer
    module = build("w8a16", int8_tensors(w, b), None, torch.bfloat16)
    xb = x.bfloat16()
    ref = F.linear(xb.float(), qparams.fake_int8_weight(w), b)
    out = module(xb)
    assert out.dtype == torch.bfloat16 and isinstance(module, W8A16Linear)
    torch.testing.assert_close(out.float(), ref, rtol=2e-2, atol=0.15)


@pytest.mark.parametrize("group", [32, 128])
def test_w4a16_kernel_matches_its_reference(layer, group):
    w, b, x = layer
    module = build("w4a16", int4_tensors(w, b, group), group, torch.bfloat16)
    xb = x.bfloat16()
    # the kernel keeps scales and zeros in bf16: so does the reference
    q, scale, zero = qparams.int4_groups(w, group)
    ref_w = qparams.int4_dequant(q, scale.bfloat16().float(), zero.bfloat16().float(), group)
    ref = F.linear(xb.float(), ref_w, b)
    out = module(xb)
    assert out.shape == (3, 5, 259) and isinstance(module, W4A16Linear)
    torch.testing.assert_close(out.float(), ref, rtol=2e-2, atol=0.2)


@pytest.mark.parametrize("kind", ["w8a8", "w8a16"])
def test_int8_modules_accept_misaligned_weights(kind):
    # safetensors hands back views at any offset; torch's int8-weight kernel crashes on those unless
    # the module copies them into aligned memory (a segfault here would kill the test process).
    torch.manual_seed(0)
    n, k = 256, 640
    buf = torch.randint(-127, 127, (n * k + 64,), dtype=torch.int8)
    w_q = buf[56 : 56 + n * k].view(n, k)
    assert w_q.data_ptr() % 64 != 0
    module = build(kind, {"w_q": w_q, "w_scale": torch.rand(n) / 100}, None, torch.bfloat16)
    for rows in (1, 4, 8, 33):
        assert module(torch.randn(rows, k).bfloat16()).shape == (rows, n)


def test_qparams_round_trips():
    torch.manual_seed(1)
    w = torch.randn(64, 256)
    q, scale = qparams.int8_per_channel(w)
    assert (q.float() * scale[:, None] - w).abs().max() <= scale.max() / 2 + 1e-6
    q4, s4, z4 = qparams.int4_groups(w, 64)
    assert q4.min() >= 0 and q4.max() <= 15
    err = (qparams.int4_dequant(q4, s4, z4, 64) - w).abs().reshape(64, 4, 64)
    assert (err <= s4[..., None] / 2 + 1e-5).all()
    assert torch.equal(qparams.unpack_nibbles(qparams.pack_nibbles(q4)), q4)
    with pytest.raises(ValueError, match="group size 100"):
        qparams.int4_groups(w, 100)


def test_awq_search_beats_round_to_nearest_on_outlier_channels():
    torch.manual_seed(0)
    x = torch.randn(512, 256)
    x[:, :4] *= 30  # a few salient input channels, as in real activations
    lin = torch.nn.Linear(256, 128, bias=False)
    w = lin.weight.detach().clone()
    s, r = awq.search_scale(x, [lin], group=128, grid=20)
    assert torch.equal(lin.weight, w)  # searching leaves the weights as they were
    mse = lambda wq: ((x @ wq.T - x @ w.T) ** 2).mean().item()  # noqa: E731
    assert r > 0
    assert mse(qparams.fake_int4_weight(w * s, 128) / s) < 0.9 * mse(qparams.fake_int4_weight(w, 128))


def test_awq_search_for_int8_activations_scores_them_and_beats_round_to_nearest():
    # w4a8: the loss is that of x / s rounded per token to int8 against the 4-bit W * s, and the chosen s
    # must beat plain rounding (r = 0) on that loss, here where a few channels carry outliers.
    torch.manual_seed(0)
    x = torch.randn(512, 256)
    x[:, :4] *= 60
    lin = torch.nn.Linear(256, 128, bias=False)
    w = lin.weight.detach().clone()
    s, r = awq.search_scale(x, [lin], group=128, grid=20, act_int8=True)
    assert torch.equal(lin.weight, w) and r > 0

    def mse(s):
        return ((qparams.fake_int8_act(x / s) @ qparams.fake_int4_weight(w * s, 128).T - x @ w.T) ** 2).mean().item()

    assert mse(s) < 0.9 * mse(torch.ones(256))
    s16, _ = awq.search_scale(x, [lin], group=128, grid=20)
    assert mse(s) <= mse(s16)  # scored as the kernel computes, it does at least as well as w4a16's choice


def test_awq_search_on_sampled_output_channels_picks_what_all_of_them_pick():
    torch.manual_seed(0)
    x = torch.randn(512, 256)
    x[:, :4] *= 30
    lin = torch.nn.Linear(256, 1024, bias=False)
    w = lin.weight.detach().clone()
    s_all, r_all = awq.search_scale(x, [lin], group=128, grid=20)
    s_some, r_some = awq.search_scale(x, [lin], group=128, grid=20, rows=256, seed=3)
    assert torch.equal(lin.weight, w)
    assert abs(r_some - r_all) <= 0.05  # a 256-row sample ranks the grid as the 1024 rows do
    assert awq.search_scale(x, [lin], 128, 20, rows=256, seed=3)[1] == r_some  # a fixed sample
    assert torch.equal(awq.search_scale(x, [lin], 128, 20, rows=4096)[0], s_all)  # rows >= N: all of them


def test_block_loss_scores_through_the_block_and_restores_it():
    torch.manual_seed(0)
    model, _ = tiny_model("llama")
    mlp = model.model.layers[0].mlp
    before = {k: v.clone() for k, v in mlp.state_dict().items()}
    x = torch.randn(64, 128)
    x[:, :3] *= 20
    with torch.no_grad():
        s, r = awq.search_scale(x, [mlp.gate_proj, mlp.up_proj], 128, 10, block=mlp)
    assert s.shape == (128,) and 0 <= r < 1
    assert all(torch.equal(v, mlp.state_dict()[k]) for k, v in before.items())


def test_clip_search_never_increases_the_error():
    torch.manual_seed(0)
    x, w = torch.randn(256, 256), torch.randn(64, 256)
    w[0, 0] = 12.0  # an outlier weight worth clipping
    clip = awq.search_clip(x, w, group=128)
    full = w.abs().reshape(64, 2, 128).amax(-1)
    assert (clip <= full + 1e-6).all() and (clip < full).any()
    mse = lambda wq: ((x @ wq.T - x @ w.T) ** 2).mean().item()  # noqa: E731
    assert mse(qparams.fake_int4_weight(w, 128, clip)) <= mse(qparams.fake_int4_weight(w, 128))


def test_clip_search_in_bf16_operands_picks_clips_as_good_as_fp32s(monkeypatch):
    # where the CPU multiplies bf16 natively the trials are scored by bf16 GEMMs: a clip it picks may differ from
    # fp32's only where two trials' errors are within the operands' rounding, so each group's error stays fp32's best
    torch.manual_seed(0)
    x, w = torch.randn(512, 256), torch.randn(96, 256)
    exact = awq.search_clip(x, w, group=128)
    monkeypatch.setattr(awq.bf16math, "native", lambda: True)
    picked = awq.search_clip(x, w, group=128)

    def error(clip):  # each (row, group)'s output error, in float64
        change = (qparams.fake_int4_weight(w, 128, clip) - w).double().reshape(96, 2, 128)
        xg = x.double().reshape(512, 2, 128)
        return torch.einsum("tgk,rgk->rgt", xg, change).pow(2).mean(-1)

    assert (picked != exact).float().mean() < 0.1
    assert (error(picked) <= error(exact) * 1.01 + 1e-12).all()


@pytest.mark.parametrize("precision", list(SPECS))
@pytest.mark.parametrize("arch", ARCHS)
def test_quantized_tiny_model_runs_real_kernels_and_generates(arch, precision):
    model, tok = tiny_model(arch)
    spec = SPECS[precision]
    ids = tok("def add(a, b):", return_tensors="pt").input_ids
    float_logits = logits(model, ids)
    weights = quantize(model, arch, spec, calib(tok))
    model = install(model.to(DTYPE[precision]), weights, DTYPE[precision])
    assert not any(isinstance(m, torch.nn.Linear) for m in model.modules())  # every linear swapped, head too
    out = model.generate(
        ids,
        attention_mask=torch.ones_like(ids),
        max_new_tokens=6,
        min_new_tokens=6,
        do_sample=False,
        pad_token_id=tok.pad_token_id,
    )
    assert out.shape[1] == ids.shape[1] + 6
    # quantized logits stay close to float ones: the kernels compute the same function, approximately
    q_logits = logits(model, ids)
    cos = F.cosine_similarity(q_logits.flatten(), float_logits.flatten(), dim=0)
    # 4 bits on random (not trained) weights lose more: measured 0.84-0.99 across the tiny models.
    assert cos > (0.99 if precision.startswith("w8") else 0.8)


def test_tied_head_is_untied_and_the_embedding_kept():
    model, tok = tiny_model("gemma3")
    assert model.lm_head.weight is model.get_input_embeddings().weight
    embedding = model.get_input_embeddings().weight.detach().clone()
    install(model, quantize(model, "gemma3", SPECS["rtn"], None), torch.float32)
    assert isinstance(model.lm_head, W4A16Linear)
    assert torch.equal(model.get_input_embeddings().weight, embedding)
    assert model.config.tie_word_embeddings is False


def test_cache_is_reused_and_a_corrupt_file_rebuilt(tmp_path):
    def run():
        model, tok = tiny_model("llama")
        return quantize_model(
            model,
            tok,
            "llama",
            SPECS["w8a8"],
            "tiny:llama",
            lambda: "x = [i * i for i in range(10)]\n" * 400,
            4,
            64,
            tmp_path,
            "tiny-llama",
            torch.float32,
        )

    ids = torch.tensor([[1, 70, 71, 72]])
    first_model, first = run()
    second_model, second = run()
    assert first.built and not second.built and first.cache_dir == second.cache_dir
    torch.testing.assert_close(logits(second_model, ids), logits(first_model, ids))
    weights_file = first.cache_dir / "layer-00000.safetensors"
    data = bytearray(weights_file.read_bytes())
    data[-10] ^= 0xFF
    weights_file.write_bytes(bytes(data))
    third_model, third = run()
    assert third.built
    torch.testing.assert_close(logits(third_model, ids), logits(first_model, ids))


def test_cache_key_covers_every_parameter():
    from src.quant.cache import cache_key

    base = cache_key("src", SPECS["w4a16"], "h")
    assert base != cache_key("src", quant_spec("awq", "w4a16", group_size=64, awq_grid=5, awq_search_tokens=256), "h")
    assert base != cache_key("src", SPECS["w4a16"], "other-calibration")
    assert base != cache_key("other-source", SPECS["w4a16"], "h")
    assert base == cache_key("src", SPECS["w4a16"], "h")


def test_every_decoder_linear_is_quantized():
    model, tok = tiny_model("opt")
    weights = quantize(model, "opt", SPECS["rtn"], None)
    assert set(decoder_linears(model, "opt")) | {"lm_head"} == set(weights.layers)


def test_mixed_kernels_follow_the_spec():
    spec = quant_spec("rtn", "w4a16", group_size=128, head_format="w8a16", wide_linears=("mlp.down_proj",))
    assert spec.format_for("lm_head") == "w8a16"
    assert spec.format_for("model.layers.0.mlp.down_proj") == "w8a16"
    assert spec.format_for("model.layers.0.mlp.up_proj") == "w4a16"
    model, tok = tiny_model("llama")
    install(model.to(torch.bfloat16), quantize(model.float(), "llama", spec, None), torch.bfloat16)
    assert isinstance(model.model.layers[1].mlp.down_proj, W8A16Linear)
    assert isinstance(model.model.layers[1].mlp.gate_proj, W4A16Linear)
    assert isinstance(model.lm_head, W8A16Linear)
    spec8 = quant_spec("rtn", "w4a8", group_size=128, head_format="w8a8", wide_linears=("mlp.down_proj",))
    assert [spec8.format_for(n) for n in ("lm_head", "model.layers.0.mlp.down_proj", "model.layers.0.mlp.up_proj")] == [
        "w8a8",
        "w8a16",
        "w4a8",
    ]


@pytest.mark.parametrize(
    "override,expect",
    [
        ("precision.method=gptq", "precision.method='gptq' is not one of: none, smoothquant, awq, rtn"),
        ("precision.group_size=100", "precision.group_size=100 is not one the grouped kernels run"),
        ("precision.format=w3a16", "precision.format='w3a16' is not one of"),
        ("precision.method=smoothquant", "precision.method=smoothquant is for 8-bit kernels; use awq or rtn for w4a16"),
    ],
)
def test_bad_method_or_group_size_is_one_line(override, expect, store):
    from tests.support.cli import run_cli

    out = run_cli(["model=tiny-llama", "precision=w4a16", override, f"tracking.uri={store}"])
    lines = [line for line in out.stderr.splitlines() if line.startswith("quantspec:")]
    assert out.returncode == 1 and len(lines) == 1 and expect in lines[0], out.stderr[-1500:]
