"""What a family is (Family), and every family this package declares, found by name."""

from __future__ import annotations

import importlib
import pkgutil
from collections.abc import Callable
from dataclasses import dataclass, field

HEAD = "lm_head"  # the output head's module name in every family


def _head_dim(cfg) -> int:
    return getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads


def _types(cfg) -> list[str]:
    """transformers' per-layer attention kinds where the config has them, else every layer full."""
    return list(getattr(cfg, "layer_types", None) or ["full_attention"] * cfg.num_hidden_layers)


@dataclass(frozen=True)
class Family:
    """A decoder-only family as quantspec runs it: where its modules sit (paths from the model, or from one
    decoder layer) and what its arithmetic does beyond pre-norm attention and an MLP."""

    name: str  # quantspec's name (model.arch)
    model_types: tuple[str, ...]  # config.json's model_type values it serves
    gguf_architectures: tuple[str, ...] = ()  # a GGUF's general.architecture values transformers reads as it
    # from the model
    layers: str = "model.layers"
    embed: str = "model.embed_tokens"
    final_norm: str = "model.norm"
    project_in: str | None = None  # OPT's projections into and out of a narrower embedding (None where absent)
    project_out: str | None = None
    # from a decoder layer
    attn_norm: str = "input_layernorm"
    mlp_norm: str = "post_attention_layernorm"
    post_attn_norm: str | None = None  # Gemma's sandwich norms: on attention's and the MLP's outputs
    post_mlp_norm: str | None = None
    qkv: tuple[str, str, str] = ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj")
    out: str = "self_attn.o_proj"
    qk_norms: tuple[str, str] | None = None  # per-head norms of q and k, before the rotary positions
    mlp_in: tuple[str, ...] = ("mlp.gate_proj", "mlp.up_proj")  # gate and up (gated), or the one input linear
    down: str = "mlp.down_proj"
    mlp: str | None = "mlp"  # the MLP's own module (AWQ scores a scale by it), None where it sits in the layer
    act: str = "mlp.act_fn"
    # arithmetic
    # rms: w * norm(x) in the model's dtype; gemma_rms: (1 + w) * norm(x) in float32; layer: LayerNorm
    norm: str = "rms"
    rotary: str | None = "model.rotary_emb"  # the rotary embedding (None: no rotary positions)
    rope_per_type: bool = False  # Gemma 3: each layer type its own rotary table (rotary_emb(x, pos, type))
    positions: str | None = None  # learned positions' embedding (OPT's: of the position, offset by 2)
    q_scaled: bool = False  # OPT: q times the attention's own scaling before attention, scores then unscaled
    head_dim: Callable = _head_dim
    scaling: Callable = lambda cfg: _head_dim(cfg) ** -0.5  # the attention scores' scale
    layer_types: Callable = _types  # per layer: full_attention or sliding_attention (window: cfg.sliding_window)
    softcap: Callable = lambda cfg: None  # the head's logit soft-cap
    serves: Callable = lambda cfg: True  # a config of this model_type whose every part this description covers
    cpp_step: bool = True  # the C++ step (src/kernels/step.cpp) runs it
    # (the tiny models' common config fields) -> (a tiny config, its model class): src.models.tiny
    tiny: Callable | None = field(default=None, repr=False)

    @property
    def gated(self) -> bool:
        return len(self.mlp_in) == 2

    def window(self, cfg) -> int | None:
        """The sliding window, where a layer has one."""
        return cfg.sliding_window if "sliding_attention" in self.layer_types(cfg) else None


def module_at(model, path: str | None):
    """The module at `path` in `model`, or None where the family has none there or this model leaves it out (OPT's
    projections and final norm exist only at some sizes)."""
    if path is None:
        return None
    owner, _, name = path.rpartition(".")
    return getattr(model.get_submodule(owner), name, None)


def _found() -> dict[str, Family]:
    """Every module of this package that declares a FAMILY (this one declares none)."""
    package = __name__.rpartition(".")[0]
    out = {}
    for info in pkgutil.iter_modules(importlib.import_module(package).__path__):
        family = getattr(importlib.import_module(f"{package}.{info.name}"), "FAMILY", None)
        if family is not None:
            out[family.name] = family
    return dict(sorted(out.items(), key=lambda kv: ORDER.index(kv[0]) if kv[0] in ORDER else len(ORDER)))


ORDER = ("llama", "opt", "qwen2", "gemma3")  # the first four's order in messages, as the project has named them
FAMILIES: dict[str, Family] = _found()
NAMES: tuple[str, ...] = tuple(FAMILIES)


def get(name: str) -> Family:
    return FAMILIES[name]


def for_model_type(model_type: str) -> Family | None:
    """The family serving config.json's `model_type`, or None."""
    return next((f for f in FAMILIES.values() if model_type in f.model_types), None)


def for_gguf(architecture: str) -> Family | None:
    """The family serving a GGUF's general.architecture, or None."""
    return next((f for f in FAMILIES.values() if architecture in f.gguf_architectures), None)


def of(model) -> Family | None:
    """The family this built model is, where its description covers every part of it (Family.serves), else None."""
    cfg = model.config
    family = for_model_type(getattr(cfg, "model_type", None))
    return family if family is not None and family.serves(cfg) else None
