"""Where each architecture keeps its decoder layers, and which linears share an input.

A scale group is (prev, linears): the op whose output feeds the linears. Dividing prev's output by s
and multiplying the linears' input columns by s leaves the float model's function unchanged; that is
the move SmoothQuant and AWQ both make.
"""

from __future__ import annotations

from dataclasses import dataclass

from torch import nn

HEAD = "lm_head"  # the output head's module name in every supported architecture


@dataclass
class ScaleGroup:
    prev_name: str
    prev: nn.Module
    names: list[str]
    linears: list[nn.Linear]
    # The module whose output AWQ scores a scale by, where it takes the group's input alone (the MLP);
    # None: the linears' own outputs.
    block: nn.Module | None = None


# Per architecture: (norm before attention, norm before MLP, attention linears, value, out proj,
# MLP input linears, MLP hidden-producing linear, MLP output linear)
_LAYOUT = {
    "llama": (
        "input_layernorm",
        "post_attention_layernorm",
        ["self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"],
        "self_attn.v_proj",
        "self_attn.o_proj",
        ["mlp.gate_proj", "mlp.up_proj"],
        "mlp.up_proj",
        "mlp.down_proj",
    ),
    "opt": (
        "self_attn_layer_norm",
        "final_layer_norm",
        ["self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"],
        "self_attn.v_proj",
        "self_attn.out_proj",
        ["fc1"],
        "fc1",
        "fc2",
    ),
    # Gemma 3 normalizes again after attention and after the MLP; the MLP's input norm is the pre-FF one.
    "gemma3": (
        "input_layernorm",
        "pre_feedforward_layernorm",
        ["self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"],
        "self_attn.v_proj",
        "self_attn.o_proj",
        ["mlp.gate_proj", "mlp.up_proj"],
        "mlp.up_proj",
        "mlp.down_proj",
    ),
}
_LAYOUT["qwen2"] = _LAYOUT["llama"]


def decoder_layers(model: nn.Module, arch: str) -> list[nn.Module]:
    base = model.model
    return list(base.decoder.layers if arch == "opt" else base.layers)


def layer_prefix(arch: str, i: int) -> str:
    return f"model.decoder.layers.{i}." if arch == "opt" else f"model.layers.{i}."


def _group(layer: nn.Module, prefix: str, prev: str, names: list[str], block: str | None = None) -> ScaleGroup:
    return ScaleGroup(
        prefix + prev,
        layer.get_submodule(prev),
        [prefix + n for n in names],
        [layer.get_submodule(n) for n in names],
        layer.get_submodule(block) if block else None,
    )


def layer_smooth_groups(model: nn.Module, arch: str, i: int) -> list[ScaleGroup]:
    """Layer i's norm -> linears groups: SmoothQuant's (activation outliers sit in the normalized inputs)."""
    attn_norm, mlp_norm, qkv, _, _, mlp_in, _, _ = _LAYOUT[arch]
    layer, p = decoder_layers(model, arch)[i], layer_prefix(arch, i)
    # OPT's MLP is not a module of its own (fc1 -> act -> fc2 sit in the layer): no block there.
    mlp = "mlp" if arch != "opt" else None
    return [_group(layer, p, attn_norm, qkv), _group(layer, p, mlp_norm, mlp_in, mlp)]


def layer_awq_groups(model: nn.Module, arch: str, i: int) -> list[ScaleGroup]:
    """Layer i's SmoothQuant groups plus its linear -> linear ones (v -> o, up -> down), as AWQ scales them."""
    _, _, _, v, o, _, up, down = _LAYOUT[arch]
    layer, p = decoder_layers(model, arch)[i], layer_prefix(arch, i)
    groups = layer_smooth_groups(model, arch, i)
    # v -> o only when v's outputs are o's inputs one to one (not under grouped-query attention).
    if layer.get_submodule(v).out_features == layer.get_submodule(o).in_features:
        groups.append(_group(layer, p, v, [o]))
    groups.append(_group(layer, p, up, [down]))
    return groups


def output_linear(arch: str, i: int) -> str:
    """Layer i's linear whose output only the layer's output reads (the MLP's output projection): no other linear's
    input depends on it."""
    return layer_prefix(arch, i) + _LAYOUT[arch][7]


def awq_groups(model: nn.Module, arch: str) -> list[ScaleGroup]:
    """Every layer's AWQ groups, in layer order."""
    return [g for i in range(len(decoder_layers(model, arch))) for g in layer_awq_groups(model, arch, i)]


def decoder_linears(model: nn.Module, arch: str) -> dict[str, nn.Linear]:
    return {
        f"{layer_prefix(arch, i)}{n}": m
        for i, layer in enumerate(decoder_layers(model, arch))
        for n, m in layer.named_modules()
        if isinstance(m, nn.Linear)
    }


def is_gemma_norm(module: nn.Module) -> bool:
    # Gemma's RMSNorm scales by (1 + weight), not weight.
    return type(module).__name__.startswith("Gemma")
