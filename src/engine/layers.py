"""The decoder's layer loop, written once over a family's description (src.models.families): the Python step path
(src.engine.python_step) and the static step (src.engine.static_step) both run it. They differ only in how a norm and a group
of linears over one input are called (`norm` and `linears`, given once when the loop is built) and in how rotary
positions and attention meet their cache (`rope` and `attend`, each driver's own: a growing DynamicCache, or fixed
buffers written at a position tensor). The C++ step (src.engine.cpp_step) is handed the same parts.

A layer: its input norm, q/k/v as one call, q scaled (OPT), per-head q/k norms (Gemma 3), rotary positions,
attention, the output projection (its output normed: Gemma 3's sandwich), the residual; the MLP's norm, its input
linears as one call, the activation (gated: act(gate) * up), the down projection (normed: Gemma 3), the residual.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn
from torch.nn import functional as F

from src.models.families import HEAD, Family, module_at

Norm = Callable[[nn.Module], Callable[[torch.Tensor], torch.Tensor]]  # a norm module -> its function
Linears = Callable[[list[nn.Module]], Callable[[torch.Tensor], list[torch.Tensor]]]  # linears on one input -> one call


class Parts:
    """One decoder layer's parts, as the loop calls them."""

    def __init__(self, family: Family, layer: nn.Module, norm: Norm, linears: Linears):
        get = layer.get_submodule
        self.attn_norm, self.mlp_norm = norm(get(family.attn_norm)), norm(get(family.mlp_norm))
        self.post_attn = norm(get(family.post_attn_norm)) if family.post_attn_norm else None
        self.post_mlp = norm(get(family.post_mlp_norm)) if family.post_mlp_norm else None
        self.qk_norms = tuple(norm(get(n)) for n in family.qk_norms) if family.qk_norms else None
        self.attn_in = linears([get(n) for n in family.qkv])
        self.mlp_in = linears([get(n) for n in family.mlp_in])
        self.out, self.down, self.act = get(family.out), get(family.down), get(family.act)
        self.q_scale = get(family.qkv[0].rpartition(".")[0]).scaling if family.q_scaled else None


class Loop:
    """A model's embedding, layers and head as its family lays them out. A driver subclass gives `rope(i, q, key,
    step)` and `attend(i, q, key, value, step)`; `step` is whatever per-call state it keeps (cache, mask, tables)."""

    def __init__(self, model, family: Family, norm: Norm, linears: Linears):
        cfg = model.config
        get = model.get_submodule
        self.model, self.family = model, family
        self.head_dim, self.scaling = family.head_dim(cfg), family.scaling(cfg)
        self.types = family.layer_types(cfg)
        self.window = family.window(cfg)
        self.softcap = family.softcap(cfg)
        self.layers = list(get(family.layers))
        self.parts = [Parts(family, layer, norm, linears) for layer in self.layers]
        self.embedding = get(family.embed)
        self.positions = get(family.positions) if family.positions else None
        self.project_in = module_at(model, family.project_in)
        self.project_out = module_at(model, family.project_out)
        final = module_at(model, family.final_norm)
        self.final = norm(final) if final is not None else None
        # each layer's rotary table by name, and what makes each table: (x, positions [1, k]) -> (cos, sin)
        rotary = module_at(model, family.rotary)
        self.table = [t if family.rope_per_type else "all" for t in self.types]
        if rotary is None:
            self.tables: dict[str, Callable] = {}
        elif family.rope_per_type:
            self.tables = {t: (lambda x, p, t=t: rotary(x, p, t)) for t in dict.fromkeys(self.types)}
        else:
            self.tables = {"all": rotary}

    def heads(self, x: torch.Tensor) -> torch.Tensor:
        """[1, k, heads * head_dim] -> [1, heads, k, head_dim]."""
        return x.view(1, x.shape[1], -1, self.head_dim).transpose(1, 2)

    def embed(self, ids: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
        """ids [1, k] at positions pos [k] -> hidden states (Gemma's embedding multiplies by its scale itself;
        OPT's learned positions are an embedding of the position plus 2, as its module adds)."""
        h = self.embedding(ids)
        if self.project_in is not None:
            h = self.project_in.forward(h)
        if self.positions is not None:
            h = h + F.embedding(pos[None] + self.positions.offset, self.positions.weight)
        return h

    def layer(self, i: int, h: torch.Tensor, step) -> torch.Tensor:
        p = self.parts[i]
        q, key, value = p.attn_in(p.attn_norm(h))
        if p.q_scale is not None:
            q = q * p.q_scale
        q, key = self.heads(q), self.heads(key)
        if p.qk_norms is not None:
            q, key = p.qk_norms[0](q), p.qk_norms[1](key)
        q, key = self.rope(i, q, key, step)
        out = p.out.forward(self.attend(i, q, key, self.heads(value), step))
        h = h + (p.post_attn(out) if p.post_attn is not None else out)
        inner = p.mlp_in(p.mlp_norm(h))
        x = p.down.forward(p.act(inner[0]) * inner[1] if len(inner) == 2 else p.act(inner[0]))
        return h + (p.post_mlp(x) if p.post_mlp is not None else x)

    def finish(self, h: torch.Tensor) -> torch.Tensor:
        """The last layer's states -> logits: the final norm, OPT's projection out, the head, Gemma's soft-cap."""
        if self.final is not None:
            h = self.final(h)
        if self.project_out is not None:
            h = self.project_out.forward(h)
        logits = self.model.get_submodule(HEAD).forward(h)
        return logits if self.softcap is None else torch.tanh(logits / self.softcap) * self.softcap

    def rope(self, i: int, q: torch.Tensor, key: torch.Tensor, step) -> tuple[torch.Tensor, torch.Tensor]:
        raise NotImplementedError

    def attend(self, i: int, q, key, value, step) -> torch.Tensor:
        raise NotImplementedError


def signed(rope) -> tuple[torch.Tensor, torch.Tensor]:
    """(cos, sin) [1, k, D] from the model's rotary embedding -> [1, 1, k, D] each, sin's first half
    negated: transformers' x * cos + rotate_half(x) * sin, rotate_half(x) = (-x2, x1), is then
    x * cos + roll(x, D / 2) * sin', with the same products (a negation is exact)."""
    cos, sin = rope
    half = sin.shape[-1] // 2
    return cos.unsqueeze(1), torch.cat((-sin[..., :half], sin[..., half:]), dim=-1).unsqueeze(1)


def rotated(q: torch.Tensor, key: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor):
    """q and key at their positions (signed's cos and sin)."""
    half = q.shape[-1] // 2
    return q * cos + q.roll(half, -1) * sin, key * cos + key.roll(half, -1) * sin
