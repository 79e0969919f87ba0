"""Where each family keeps its decoder layers, and which linears share an input (read from its description:
src.models.families).

A scale group is (prev, linears): the op whose output feeds the linears. Dividing prev's output by s
and multiplying the linears' input columns by s leaves the float model's function unchanged; that is
the move SmoothQuant and AWQ both make.
"""

from __future__ import annotations

from dataclasses import dataclass

from torch import nn

from src.models import families


@dataclass
class ScaleGroup:
    prev_name: str
    prev: nn.Module
    names: list[str]
    linears: list[nn.Linear]
    # The module whose output AWQ scores a scale by, where it takes the group's input alone (the MLP);
    # None: the linears' own outputs.
    block: nn.Module | None = None


def decoder_layers(model: nn.Module, arch: str) -> list[nn.Module]:
    return list(model.get_submodule(families.get(arch).layers))


def layer_prefix(arch: str, i: int) -> str:
    return f"{families.get(arch).layers}.{i}."


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
    f = families.get(arch)
    layer, p = decoder_layers(model, arch)[i], layer_prefix(arch, i)
    # where the MLP is not a module of its own (OPT's fc1 -> act -> fc2 sit in the layer) there is no block
    return [_group(layer, p, f.attn_norm, list(f.qkv)), _group(layer, p, f.mlp_norm, list(f.mlp_in), f.mlp)]


def layer_awq_groups(model: nn.Module, arch: str, i: int) -> list[ScaleGroup]:
    """Layer i's SmoothQuant groups plus its linear -> linear ones (v -> o, up -> down), as AWQ scales them."""
    f = families.get(arch)
    v, o, up, down = f.qkv[2], f.out, f.mlp_in[-1], f.down
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
    return layer_prefix(arch, i) + families.get(arch).down


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
