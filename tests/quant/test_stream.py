"""The decoder quantized layer by layer (src/quant/stream.py): each layer called on its own with the arguments the
model's forward gave it reproduces that forward on every architecture (Gemma 3's sliding and global layers take
different masks), the head's inputs are the decoder stack's output, the first layer's GPTQ inputs are the float
model's and a later layer's are those the rounded layers before it pass on, and `precision.gptq=[*]` rounds every
linear by GPTQ."""

import pytest
import torch

from src.models.tiny import tiny_model
from src.quant import schemes
from src.quant.arch import decoder_layers
from src.quant.gptq import gram
from src.quant.pipeline import install, quantize, quantized_linears
from src.quant.stream import entry, head_inputs
from src.quant.stream import layer_hidden as _hidden
from tests.helpers import calib, quant_spec

ARCHS = ["llama", "opt", "qwen2", "gemma3"]


@pytest.mark.parametrize("arch", ARCHS)
def test_each_layer_called_alone_gives_what_the_models_forward_gives_it(arch):
    model, tok = tiny_model(arch)
    batches = calib(tok, n=2, length=64)  # longer than the tiny Gemma 3's sliding window of 32
    layers = decoder_layers(model, arch)
    seen = []
    handle = layers[-1].register_forward_hook(lambda _m, _a, out: seen.append(_hidden(out).clone()))
    with torch.inference_mode():
        for row in batches:
            model.model(input_ids=row[None], use_cache=False)
    handle.remove()
    hidden, calls = entry(model, layers, batches)
    with torch.inference_mode():
        for layer, (args, kwargs) in zip(layers, calls, strict=True):
            hidden = [_hidden(layer(h, *args, **kwargs)) for h in hidden]
        for alone, forward in zip(hidden, seen, strict=True):
            assert torch.equal(alone, forward)
        # and what the head reads: the stack's output through its final norm
        for row, alone in zip(batches, hidden, strict=True):
            stack = model.model(input_ids=row[None], use_cache=False).last_hidden_state
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
    spec = quant_spec("rtn", "w4a16", group_size=128, head_scheme="w8a16", gptq=("self_attn.v_proj",))
    model, tok = tiny_model("llama")
    batches = calib(tok)
    float_model = tiny_model("llama")[0]
    linears = quantized_linears(float_model, "llama", spec)
    names = [f"model.layers.{i}.self_attn.v_proj" for i in (0, 1)]
    grams = float_grams(float_model, names, batches)
    weights = quantize(model, "llama", spec, batches)
    scheme = schemes.get("w4a16")
    for name, same in zip(names, (True, False), strict=True):
        on_float = scheme.tensors(linears[name].weight, None, 128, None, grams[name])
        assert all(torch.equal(weights.layers[name][k], v) for k, v in on_float.items()) == same, name
    # the rounded model runs
    model = install(model.to(torch.bfloat16), weights, torch.bfloat16)
    ids = tok("def add(a, b):", return_tensors="pt").input_ids
    out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=4, min_new_tokens=4, do_sample=False)
    assert out.shape[1] == ids.shape[1] + 4


@pytest.mark.parametrize("arch", ARCHS)
def test_gptq_star_rounds_every_linear_the_precision_quantizes(arch):
    model, tok = tiny_model(arch)
    batches = calib(tok)
    plain = quant_spec("rtn", "w4a16", group_size=128, head_scheme="w5a16")
    star = quant_spec("rtn", "w4a16", group_size=128, head_scheme="w5a16", gptq=("*",))
    ref = quantize(tiny_model(arch)[0], arch, plain, None)
    weights = quantize(model, arch, star, batches)
    assert weights.schemes == ref.schemes
    differ = [
        name for name, t in weights.layers.items() if not all(torch.equal(v, ref.layers[name][k]) for k, v in t.items())
    ]
    assert sorted(differ) == sorted(ref.layers), "every linear rounded by GPTQ, none to nearest"
