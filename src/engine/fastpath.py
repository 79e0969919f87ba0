"""A lean layer loop for decode steps and draft verification (engine.step_path=quantspec).

transformers' forward spends ~6 ms of Python per step on an 18-layer model (decorators, mask
builders, config lookups, ~300 module calls) before any arithmetic: on Gemma 3 270M with quantspec's
kernels that was as much as the matmuls. For a few new tokens whose context fits the attention
windows no mask is needed beyond causality, so this loop calls the model's own submodules' forwards
(the same parameters, kernels and KV cache) in the order transformers does, and nothing else.

It covers Gemma 3 text models; for anything else, or a context that reaches a sliding window, the
Decoder keeps transformers' forward. Its greedy output is tested equal to generate's.
"""

from __future__ import annotations

import torch
from torch.nn import functional as F

from src import kernels

SUPPORTED = ("gemma3_text",)


class GemmaSteps:
    """One forward over [1, k] new tokens for a Gemma3ForCausalLM, into its DynamicCache."""

    def __init__(self, model):
        cfg = model.config
        self.model, self.layers = model, list(model.model.layers)
        self.types = list(cfg.layer_types)
        self.window = cfg.sliding_window if "sliding_attention" in self.types else None
        self.head_dim, self.scaling = cfg.head_dim, cfg.query_pre_attn_scalar ** -0.5
        self.softcap = cfg.final_logit_softcapping
        # quantspec's attention where the kernels are loaded: a query's output does not depend on how
        # many queries come together, so verifying a draft reproduces plain decoding exactly (in bf16
        # too); SDPA otherwise.
        self.own_attention = kernels.loaded() and self.head_dim % 16 == 0

    @staticmethod
    def supports(model) -> bool:
        cfg = model.config
        return (cfg.model_type in SUPPORTED and cfg.attn_logit_softcapping is None
                and not cfg.use_bidirectional_attention)

    def covers(self, cached: int, new: int) -> bool:
        """Within the sliding window, causality is the only mask (transformers masks key j from query i
        when i - j >= window, so every position must be < window)."""
        return self.window is None or cached + new <= self.window

    def __call__(self, ids: torch.Tensor, cache, keep: int) -> torch.Tensor:
        base = self.model.model
        k = ids.shape[1]
        past = cache.get_seq_length()
        h = base.embed_tokens(ids)
        positions = torch.arange(past, past + k, device=ids.device)[None]
        rope = {t: base.rotary_emb(h, positions, t) for t in set(self.types)}
        # transformers' causal mask for k new tokens: query i sees keys 0 .. past + i
        mask = None if k == 1 else (torch.arange(past + k, device=ids.device)[None, :]
                                    <= torch.arange(past, past + k, device=ids.device)[:, None])
        for i, layer in enumerate(self.layers):
            h = self._layer(layer, h, rope[self.types[i]], cache, i, mask)
        h = base.norm.forward(h[:, -keep:])
        logits = self.model.lm_head.forward(h)
        if self.softcap is not None:
            logits = torch.tanh(logits / self.softcap) * self.softcap
        return logits[0]

    def _layer(self, layer, h, rope, cache, index, mask):
        attn, mlp = layer.self_attn, layer.mlp
        shape = (1, h.shape[1], -1, self.head_dim)
        x = layer.input_layernorm.forward(h)
        q = attn.q_norm.forward(attn.q_proj.forward(x).view(shape).transpose(1, 2))
        key = attn.k_norm.forward(attn.k_proj.forward(x).view(shape).transpose(1, 2))
        value = attn.v_proj.forward(x).view(shape).transpose(1, 2)
        cos, sin = (t.unsqueeze(1) for t in rope)
        q, key = q * cos + _rotate_half(q) * sin, key * cos + _rotate_half(key) * sin
        key, value = cache.update(key, value, index)
        if self.own_attention:
            out = torch.ops.quantspec.decode_attention(q, key, value, self.scaling)
        else:
            out = F.scaled_dot_product_attention(q, key, value, attn_mask=mask, scale=self.scaling, enable_gqa=True)
        out = attn.o_proj.forward(out.transpose(1, 2).reshape(1, h.shape[1], -1))
        h = h + layer.post_attention_layernorm.forward(out)
        x = layer.pre_feedforward_layernorm.forward(h)
        x = mlp.down_proj.forward(mlp.act_fn(mlp.gate_proj.forward(x)) * mlp.up_proj.forward(x))
        return h + layer.post_feedforward_layernorm.forward(x)


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def for_model(model):
    """The lean loop for this model, or None where transformers' forward stays the only path."""
    return GemmaSteps(model) if GemmaSteps.supports(model) else None
