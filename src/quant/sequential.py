"""The decoder rounded one layer at a time, in order (GPTQ's sequential pass): the calibration windows' hidden
states go through layer i, its linears are rounded (by GPTQ where precision.gptq names them, each against the
X^T X of the inputs it met), their rounded weights are put in place of the float ones, and the windows go on
through the rounded layer to layer i + 1. So each layer's rounding corrects the error of the layers before it, as
the quantized model will meet it, rather than the float model's inputs alone.

Each layer is called on its own with the arguments the model's forward gave it for the first window (its
attention mask and rotary tables: Gemma 3 gives its sliding and global layers different ones), which are the
same for every window of one length. One window's hidden states are [1, tokens, hidden] (16 x 256 tokens of a 7B
model: 67 MB in all), and one layer's X^T X at a time is held (a 7B layer's: ~1.8 GB in float64), where grams
over the whole model at once would not fit (~57 GB for a 7B).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

from src.common.progress import progress
from src.quant import gptq
from src.quant.arch import decoder_layers, layer_prefix


class _Reached(Exception):
    """Raised by a hook to stop a forward once it has what it came for."""


@torch.inference_mode()
def _layer_calls(model: nn.Module, layers: list[nn.Module], batches: torch.Tensor):
    """Layer 0's input for every window, and each layer's other arguments, as the model's forward passes them."""
    calls: list[tuple[tuple, dict] | None] = [None] * len(layers)

    def keep(i):
        def hook(_module, args, kwargs):
            if calls[i] is None:
                calls[i] = (args[1:], dict(kwargs))

        return hook

    handles = [layer.register_forward_pre_hook(keep(i), with_kwargs=True) for i, layer in enumerate(layers)]
    try:
        model.model(input_ids=batches[0][None], use_cache=False)
    finally:
        for h in handles:
            h.remove()
    inputs = []

    def first(_module, args, kwargs):
        inputs.append((args[0] if args else kwargs["hidden_states"]).detach().clone())
        raise _Reached

    handle = layers[0].register_forward_pre_hook(first, with_kwargs=True)
    try:
        for row in batches:
            try:
                model.model(input_ids=row[None], use_cache=False)
            except _Reached:
                pass
    finally:
        handle.remove()
    return inputs, calls


def _grams(layer: nn.Module, linears: dict[str, nn.Module], hidden: list[torch.Tensor], args, kwargs):
    """X^T X (float64) of each of `linears`' inputs over every window, the layer called on each. Linears that read
    one input (q, k and v the attention's; gate and up the MLP's) share one Gram, computed once and held once:
    the same tensor, so GPTQ factors it once too (gptq.round_weights)."""
    sums: dict[str, torch.Tensor] = {}  # the first linear of each shared input -> its Gram so far
    leader: dict[str, str] = {}  # linear -> the first linear that read its input
    # this window: an input tensor (by identity, held so that its id is not reused) -> the first linear that read it
    seen: dict[int, tuple[torch.Tensor, str]] = {}

    def observe(name):
        def hook(_module, a):
            first = seen.setdefault(id(a[0]), (a[0], name))[1]
            x = a[0].detach()
            leader.setdefault(name, first)
            if leader[name] != name:  # the same input as an earlier linear's: its Gram is that one's
                return
            g = gptq.gram(x.reshape(-1, x.shape[-1]))
            sums[name] = sums[name] + g if name in sums else g

        return hook

    handles = [m.register_forward_pre_hook(observe(name)) for name, m in linears.items()]
    try:
        for h in hidden:
            seen.clear()
            layer(h, *args, **kwargs)
    finally:
        for handle in handles:
            handle.remove()
    return {name: sums[first] for name, first in leader.items()}


def _hidden(out) -> torch.Tensor:
    """A decoder layer's output hidden states (some architectures return them in a tuple)."""
    return out[0] if isinstance(out, tuple) else out


@torch.inference_mode()
def round_layers(
    model: nn.Module,
    arch: str,
    linears: dict[str, nn.Module],
    gptq_names: set[str],
    rounded: Callable[[str, torch.Tensor | None], dict[str, torch.Tensor]],
    dequantized: Callable[[str, dict[str, torch.Tensor]], torch.Tensor],
    batches: torch.Tensor,
) -> dict[str, dict[str, torch.Tensor]]:
    """Every decoder linear in `linears` rounded in layer order: rounded(name, gram) gives its portable tensors
    (gram: its inputs' X^T X where it is in `gptq_names`, else None), dequantized(name, tensors) the float weight put
    in its place for the layers after it. Returns each linear's tensors."""
    layers = decoder_layers(model, arch)
    hidden, calls = _layer_calls(model, layers, batches)
    out: dict[str, dict[str, torch.Tensor]] = {}
    for i, layer in enumerate(progress(layers, "sequential rounding")):
        prefix = layer_prefix(arch, i)
        mine = {name: m for name, m in linears.items() if name.startswith(prefix)}
        args, kwargs = calls[i]
        wanted = {name: m for name, m in mine.items() if name in gptq_names}
        grams = _grams(layer, wanted, hidden, args, kwargs) if wanted else {}
        for name, m in mine.items():
            out[name] = rounded(name, grams.pop(name, None))
            m.weight.data = dequantized(name, out[name]).to(m.weight.dtype)
        gptq.forget()  # the layer's factors: the next layer's inputs are others
        hidden = [_hidden(layer(h, *args, **kwargs)) for h in hidden]
    return out
