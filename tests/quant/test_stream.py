"""The decoder quantized layer by layer (src/quant/stream.py): each layer called on its own with the arguments the
model's forward gave it reproduces that forward on every architecture (Gemma 3's sliding and global layers take
different masks), the head's inputs are the decoder stack's output, the first layer's GPTQ inputs are the float
model's and a later layer's are those the rounded layers before it pass on, `precision.gptq=[*]` rounds every
linear by GPTQ, and the calibration forwards multiply bf16 on the path the host chose (its bf16 GEMM, or fp32)."""

import pytest
import torch

from src.models import families
from src.models.tiny import tiny_model
from src.quant import formats, stream
from src.quant.arch import decoder_layers
from src.quant.gptq import gram
from src.quant.pipeline import install, quantize, quantized_linears
from src.quant.stream import _fp32_forward, entry, head_inputs, per_call
from src.quant.stream import layer_hidden as _hidden
from tests.support.quant import calib, quant_spec

ARCHS = families.NAMES  # every family src.models.families describes: a new one is tested here by its file alone


@pytest.mark.parametrize("arch", ARCHS)
def test_each_layer_called_alone_gives_what_the_models_forward_gives_it(arch):
    model, tok = tiny_model(arch)
    batches = calib(tok, n=2, length=64)  # longer than the tiny Gemma 3's sliding window of 32
    layers = decoder_layers(model, arch)
    seen = []
    handle = layers[-1].register_forward_hook(lambda _m, _a, out: seen.append(_hidden(out).clone()))
    split = batches.split(per_call(*batches.shape))  # the windows as the pass runs them: batches of them
    assert len(split) < len(batches)
    with torch.inference_mode():
        for rows in split:
            model.model(input_ids=rows, use_cache=False)
    handle.remove()
    hidden, calls = entry(model, layers, batches)
    with torch.inference_mode():
        for layer, (args, kwargs) in zip(layers, calls, strict=True):
            hidden = [_hidden(layer(h, *args, **kwargs)) for h in hidden]
        for alone, forward in zip(hidden, seen, strict=True):
            assert torch.equal(alone, forward)
        # and what the head reads: the stack's output through its final norm
        for rows, alone in zip(split, hidden, strict=True):
            stack = model.model(input_ids=rows, use_cache=False).last_hidden_state
            assert torch.equal(head_inputs(model, arch, alone), stack)


def float_grams(model, names, batches):
    """X^T X of the named linears' inputs over all the windows' rows at once, as the float model meets them."""
    rows = {name: [] for name in names}

    def observe(name):
        return lambda _module, args: rows[name].append(args[0].reshape(-1, args[0].shape[-1]).clone())

    handles = [model.get_submodule(n).register_forward_pre_hook(observe(n)) for n in names]
    with torch.inference_mode():
        for row in batches:
            model.model(input_ids=row[None], use_cache=False)
    for h in handles:
        h.remove()
    return {name: gram(torch.cat(xs)) for name, xs in rows.items()}


def test_layer_zeros_gptq_inputs_are_the_float_models_and_later_layers_meet_the_rounded_ones():
    spec = quant_spec("rtn", "w4a16", group_size=128, head_format="w8a16", gptq=("self_attn.v_proj",))
    model, tok = tiny_model("llama")
    batches = calib(tok)
    float_model = tiny_model("llama")[0]
    linears = quantized_linears(float_model, "llama", spec)
    names = [f"model.layers.{i}.self_attn.v_proj" for i in (0, 1)]
    grams = float_grams(float_model, names, batches)
    weights = quantize(model, "llama", spec, batches)
    fmt = formats.get("w4a16")
    for name, same in zip(names, (True, False), strict=True):
        on_float = fmt.tensors(linears[name].weight, None, 128, None, grams[name])
        assert all(torch.equal(weights.layers[name][k], v) for k, v in on_float.items()) == same, name
    # the rounded model runs
    model = install(model.to(torch.bfloat16), weights, torch.bfloat16)
    ids = tok("def add(a, b):", return_tensors="pt").input_ids
    out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=4, min_new_tokens=4, do_sample=False)
    assert out.shape[1] == ids.shape[1] + 4


def test_under_calib_inputs_float_every_layer_meets_the_float_models_states_in_one_forward(monkeypatch):
    spec = quant_spec("rtn", "w4a16", group_size=128, head_format="w8a16", gptq=("*",), calib_inputs="float")
    model, tok = tiny_model("llama")
    batches = calib(tok)
    float_model = tiny_model("llama")[0]
    linears = quantized_linears(float_model, "llama", spec)
    names = [f"model.layers.{i}.{n}" for i in (0, 1) for n in ("self_attn.v_proj", "mlp.down_proj")]
    grams = float_grams(float_model, names, batches)
    calls = []
    real = stream.observe
    monkeypatch.setattr(stream, "observe", lambda *a, **k: calls.append(k) or real(*a, **k))
    weights = stream.quantize(model, "llama", spec, batches)
    for name in names:  # layer 1's too: the float model's inputs, not the rounded layer 0's
        on_float = formats.get(spec.format_for(name)).tensors(linears[name].weight, None, 128, None, grams[name])
        assert all(torch.equal(weights.layers[name][k], v) for k, v in on_float.items()), name
    # one forward a layer, every GEMM in it (its outputs go on): none through the rounded weights
    layers = decoder_layers(model, "llama")
    assert len(calls) == len(layers) and all(k.get("outputs") and k.get("last") is None for k in calls)


@pytest.mark.parametrize("arch", ARCHS)
def test_gptq_star_rounds_every_linear_the_precision_quantizes(arch):
    model, tok = tiny_model(arch)
    batches = calib(tok)
    plain = quant_spec("rtn", "w4a16", group_size=128, head_format="w5a16")
    star = quant_spec("rtn", "w4a16", group_size=128, head_format="w5a16", gptq=("*",))
    ref = quantize(tiny_model(arch)[0], arch, plain, None)
    weights = quantize(model, arch, star, batches)
    assert weights.format_of == ref.format_of
    differ = [
        name for name, t in weights.layers.items() if not all(torch.equal(v, ref.layers[name][k]) for k, v in t.items())
    ]
    assert sorted(differ) == sorted(ref.layers), "every linear rounded by GPTQ, none to nearest"


def test_a_bf16_linear_on_the_fp32_path_is_its_bf16_gemm_up_to_the_order_of_sums():
    torch.manual_seed(0)
    linear = torch.nn.Linear(96, 40, dtype=torch.bfloat16)
    x = torch.randn(3, 70, 96).bfloat16()
    with torch.inference_mode():
        ours, aten = _fp32_forward(linear)(x), linear(x)
    assert ours.dtype == torch.bfloat16 and ours.shape == aten.shape
    # both round the same fp32 sums once to bf16: at most one bf16 step apart
    assert torch.allclose(ours.float(), aten.float(), rtol=2**-7, atol=1e-6)


def test_calibration_forwards_multiply_bf16_on_the_path_the_host_chose(monkeypatch):
    spec = quant_spec("awq", "w4a16", group_size=128, head_format="w5a16", gptq=("*",))
    tok = tiny_model("llama")[1]
    batches = calib(tok)
    paths = []
    real = stream.many_rows_mm
    monkeypatch.setattr(stream, "many_rows_mm", lambda x, w, path: paths.append(path) or real(x, w, path))
    made = {p: stream.quantize(tiny_model("llama")[0].to(torch.bfloat16), "llama", spec, batches, float_gemm=p)
            for p in ("bf16", "fp32")}  # fmt: skip
    layers = decoder_layers(tiny_model("llama")[0], "llama")
    # every linear of every layer, twice (float, then rounded) for each batch of windows, but the float pass's
    # down_proj
    calls = len(batches) // per_call(*batches.shape)
    assert len(paths) == len(layers) * calls * (7 + 6) and set(paths) == {"fp32"}
    # the same rounding but for the order of the forwards' sums. GPTQ sends a weight near a half-step on (and AWQ's
    # scale is one of a grid's), so not bit for bit: the rounded models' outputs are as far from the float one's
    reference = tiny_model("llama")[0].to(torch.bfloat16)
    ids = batches[:2]
    with torch.inference_mode():
        want = reference(input_ids=ids).logits.float()
        error = {}
        for p, weights in made.items():
            model = install(tiny_model("llama")[0].to(torch.bfloat16), weights, torch.bfloat16)
            error[p] = (model(input_ids=ids).logits.float() - want).pow(2).mean().item()
    assert 0.8 < error["fp32"] / error["bf16"] < 1.25, error


def test_a_calibration_forward_takes_as_many_whole_windows_as_fit_in_equal_batches():
    assert per_call(16, 256) == 16  # 4096 tokens: the default calibration in one call
    assert per_call(20, 256) == 10  # 16 fit, but 20 windows go in equal batches
    assert per_call(7, 1000) == 1  # 4 fit; 7 is prime
    assert per_call(3, 10_000) == 1  # a window longer than a call's tokens still goes whole
