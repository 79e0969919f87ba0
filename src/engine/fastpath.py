"""A lean layer loop for decode steps and draft verification (engine.step_path=quantspec).

transformers' forward spends ~6 ms of Python per step on an 18-layer model (decorators, mask
builders, config lookups, ~300 module calls) before any arithmetic: on Gemma 3 270M with quantspec's
kernels that was as much as the matmuls. For a few new tokens whose context fits the attention
windows no mask is needed beyond causality, so this loop calls the model's own submodules' forwards
(the same parameters, kernels and KV cache) in the order transformers does, and nothing else. The
linears that read one input (q/k/v, gate/up) take one kernel call where their kinds allow
(src.engine.fused), and rotary positions take four tensor ops instead of nine.

It covers Gemma 3 text models, Llama (Llama 2, CodeLlama), Qwen2 (Qwen1.5) and OPT; for anything
else, or a context that reaches a sliding window, the Decoder keeps transformers' forward. Its greedy
output is tested equal to generate's on a tiny model of each family.
"""

from __future__ import annotations

import torch
from torch.nn import functional as F

from src.engine.fused import Projection
from src.kernels import modules


class Steps:
    """One forward over [1, k] new tokens into the model's DynamicCache; the families differ in their
    embeddings and layers (below)."""

    window: int | None = None  # a sliding window: beyond it, masks other than causality are needed

    def __init__(self, model, head_dim: int, scaling: float):
        self.model, self.head_dim, self.scaling = model, head_dim, scaling
        # quantspec's attention where the model runs on quantspec's kernels: a query's output does not
        # depend on how many queries come together, so verifying a draft reproduces plain decoding exactly
        # (in bf16 too); SDPA otherwise.
        self.own_attention = modules.installed(model) and head_dim in (16, 32, 64, 128, 256)

    def covers(self, cached: int, new: int) -> bool:
        """Within the sliding window, causality is the only mask (transformers masks key j from query i
        when i - j >= window, so every position must be < window)."""
        return self.window is None or cached + new <= self.window

    @staticmethod
    def _mask(past: int, k: int, device) -> torch.Tensor | None:
        # transformers' causal mask for k new tokens: query i sees keys 0 .. past + i
        return (
            None
            if k == 1
            else (
                torch.arange(past + k, device=device)[None, :] <= torch.arange(past, past + k, device=device)[:, None]
            )
        )

    def _attend(self, q, key, value, mask) -> torch.Tensor:
        """[1, heads, k, head_dim] -> [1, k, heads * head_dim], scores scaled by self.scaling."""
        if self.own_attention:
            out = torch.ops.quantspec.decode_attention(q, key, value, self.scaling)
        else:
            out = F.scaled_dot_product_attention(q, key, value, attn_mask=mask, scale=self.scaling, enable_gqa=True)
        return out.transpose(1, 2).reshape(1, q.shape[2], -1)

    def _heads(self, x: torch.Tensor) -> torch.Tensor:
        return x.view(1, x.shape[1], -1, self.head_dim).transpose(1, 2)


class GemmaSteps(Steps):
    """Gemma3ForCausalLM: sandwich norms, q/k norms, sliding and global layers, a soft-capped head."""

    def __init__(self, model):
        cfg = model.config
        super().__init__(model, cfg.head_dim, cfg.query_pre_attn_scalar**-0.5)
        self.layers = list(model.model.layers)
        self.attn_in = [Projection([a.q_proj, a.k_proj, a.v_proj]) for a in (layer.self_attn for layer in self.layers)]
        self.mlp_in = [Projection([layer.mlp.gate_proj, layer.mlp.up_proj]) for layer in self.layers]
        self.types = list(cfg.layer_types)
        self.window = cfg.sliding_window if "sliding_attention" in self.types else None
        self.softcap = cfg.final_logit_softcapping

    @staticmethod
    def supports(model) -> bool:
        cfg = model.config
        return (
            cfg.model_type == "gemma3_text"
            and cfg.attn_logit_softcapping is None
            and not cfg.use_bidirectional_attention
        )

    def __call__(self, ids: torch.Tensor, cache, keep: int) -> torch.Tensor:
        base = self.model.model
        k = ids.shape[1]
        past = cache.get_seq_length()
        h = base.embed_tokens(ids)
        positions = torch.arange(past, past + k, device=ids.device)[None]
        rope = {t: _signed(base.rotary_emb(h, positions, t)) for t in set(self.types)}
        mask = self._mask(past, k, ids.device)
        for i, layer in enumerate(self.layers):
            h = self._layer(i, layer, h, rope[self.types[i]], cache, mask)
        h = base.norm.forward(h[:, -keep:])
        logits = self.model.lm_head.forward(h)
        if self.softcap is not None:
            logits = torch.tanh(logits / self.softcap) * self.softcap
        return logits[0]

    def _layer(self, i, layer, h, rope, cache, mask):
        attn, mlp = layer.self_attn, layer.mlp
        q, key, value = self.attn_in[i](layer.input_layernorm.forward(h))
        q, key = _rope(attn.q_norm.forward(self._heads(q)), attn.k_norm.forward(self._heads(key)), rope)
        key, value = cache.update(key, self._heads(value), i)
        out = attn.o_proj.forward(self._attend(q, key, value, mask))
        h = h + layer.post_attention_layernorm.forward(out)
        gate, up = self.mlp_in[i](layer.pre_feedforward_layernorm.forward(h))
        x = mlp.down_proj.forward(mlp.act_fn(gate) * up)
        return h + layer.post_feedforward_layernorm.forward(x)


class LlamaSteps(Steps):
    """LlamaForCausalLM and Qwen2ForCausalLM (Qwen2's q/k/v biases live in its linears): pre-norm
    layers, rotary positions, grouped-query attention, a gated MLP."""

    FAMILIES = ("llama", "qwen2")

    def __init__(self, model):
        cfg = model.config
        head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
        super().__init__(model, head_dim, head_dim**-0.5)
        self.layers = list(model.model.layers)
        self.attn_in = [Projection([a.q_proj, a.k_proj, a.v_proj]) for a in (layer.self_attn for layer in self.layers)]
        self.mlp_in = [Projection([layer.mlp.gate_proj, layer.mlp.up_proj]) for layer in self.layers]
        types = list(getattr(cfg, "layer_types", None) or [])
        self.window = cfg.sliding_window if "sliding_attention" in types else None

    @staticmethod
    def supports(model) -> bool:
        return model.config.model_type in LlamaSteps.FAMILIES

    def __call__(self, ids: torch.Tensor, cache, keep: int) -> torch.Tensor:
        base = self.model.model
        k, past = ids.shape[1], cache.get_seq_length()
        h = base.embed_tokens(ids)
        rope = _signed(base.rotary_emb(h, torch.arange(past, past + k, device=ids.device)[None]))
        mask = self._mask(past, k, ids.device)
        for i, layer in enumerate(self.layers):
            attn, mlp = layer.self_attn, layer.mlp
            q, key, value = self.attn_in[i](layer.input_layernorm.forward(h))
            q, key = _rope(self._heads(q), self._heads(key), rope)
            key, value = cache.update(key, self._heads(value), i)
            h = h + attn.o_proj.forward(self._attend(q, key, value, mask))
            gate, up = self.mlp_in[i](layer.post_attention_layernorm.forward(h))
            h = h + mlp.down_proj.forward(mlp.act_fn(gate) * up)
        return self.model.lm_head.forward(base.norm.forward(h[:, -keep:]))[0]


class OptSteps(Steps):
    """OPTForCausalLM with layer norm before attention (every size but 350m): learned positions, q
    scaled before attention (as OPT does, so the sums round alike), a ReLU MLP."""

    def __init__(self, model):
        cfg = model.config
        head_dim = cfg.hidden_size // cfg.num_attention_heads
        super().__init__(model, head_dim, 1.0)  # q is scaled before attention, as OPT does
        self.decoder = model.model.decoder
        self.layers = list(self.decoder.layers)

    @staticmethod
    def supports(model) -> bool:
        return model.config.model_type == "opt" and model.config.do_layer_norm_before

    def __call__(self, ids: torch.Tensor, cache, keep: int) -> torch.Tensor:
        dec = self.decoder
        k, past = ids.shape[1], cache.get_seq_length()
        h = dec.embed_tokens(ids)
        if dec.project_in is not None:
            h = dec.project_in.forward(h)
        h = h + dec.embed_positions(None, past, position_ids=torch.arange(past, past + k, device=ids.device)[None])
        mask = self._mask(past, k, ids.device)
        for i, layer in enumerate(self.layers):
            attn = layer.self_attn
            x = layer.self_attn_layer_norm.forward(h)
            q = self._heads(attn.q_proj.forward(x) * attn.scaling)
            key, value = cache.update(self._heads(attn.k_proj.forward(x)), self._heads(attn.v_proj.forward(x)), i)
            h = h + attn.out_proj.forward(self._attend(q, key, value, mask))
            x = layer.final_layer_norm.forward(h)
            h = h + layer.fc2.forward(layer.activation_fn(layer.fc1.forward(x)))
        h = h[:, -keep:]
        if dec.final_layer_norm is not None:
            h = dec.final_layer_norm.forward(h)
        if dec.project_out is not None:
            h = dec.project_out.forward(h)
        return self.model.lm_head.forward(h)[0]


def _signed(rope) -> tuple[torch.Tensor, torch.Tensor]:
    """(cos, sin) [1, k, D] from the model's rotary embedding -> [1, 1, k, D] each, sin's first half
    negated: transformers' x * cos + rotate_half(x) * sin, rotate_half(x) = (-x2, x1), is then
    x * cos + roll(x, D / 2) * sin', with the same products (a negation is exact), once per step."""
    cos, sin = rope
    half = sin.shape[-1] // 2
    return cos.unsqueeze(1), torch.cat((-sin[..., :half], sin[..., half:]), dim=-1).unsqueeze(1)


def _rope(q: torch.Tensor, key: torch.Tensor, rope) -> tuple[torch.Tensor, torch.Tensor]:
    cos, sin = rope
    half = q.shape[-1] // 2
    return q * cos + q.roll(half, -1) * sin, key * cos + key.roll(half, -1) * sin


def for_model(model):
    """The lean loop for this model, or None where transformers' forward stays the only path. Built once
    per model and kept on it: building fuses linears (src.engine.fused), a copy of their weights."""
    steps = model.__dict__.get("_quantspec_steps")
    if steps is None:
        family = next((s for s in (GemmaSteps, LlamaSteps, OptSteps) if s.supports(model)), None)
        steps = family(model) if family else False
        model.__dict__["_quantspec_steps"] = steps
    return steps or None
