"""Gemma 3's text models: sandwich norms scaling by (1 + w) in float32, q/k norms, sliding and global layers each
with its rotary table, a soft-capped head. Its multimodal checkpoints (model_type gemma3) are not this: transformers
builds them as Gemma3ForConditionalGeneration, whose layers sit elsewhere."""

from src.models.families.description import Family


def _tiny(common):
    # imported when a tiny model is built: the config check imports every family, and transformers takes seconds
    from transformers import Gemma3ForCausalLM, Gemma3TextConfig

    # two layers, one of each kind, so both paths are exercised
    cfg = Gemma3TextConfig(
        intermediate_size=256,
        num_key_value_heads=2,
        head_dim=32,
        sliding_window=32,
        layer_types=["sliding_attention", "full_attention"],
        **common,
    )
    return cfg, Gemma3ForCausalLM


FAMILY = Family(
    name="gemma3",
    model_types=("gemma3_text",),
    gguf_architectures=("gemma3",),
    mlp_norm="pre_feedforward_layernorm",
    post_attn_norm="post_attention_layernorm",
    post_mlp_norm="post_feedforward_layernorm",
    qk_norms=("self_attn.q_norm", "self_attn.k_norm"),
    norm="gemma_rms",
    rope_per_type=True,
    scaling=lambda cfg: cfg.query_pre_attn_scalar**-0.5,
    softcap=lambda cfg: cfg.final_logit_softcapping,
    serves=lambda cfg: cfg.attn_logit_softcapping is None and not cfg.use_bidirectional_attention,
    tiny=_tiny,
)
