"""Mistral (Mistral 7B): Llama's layers, each attending over a sliding window of cfg.sliding_window positions where
the config sets one (transformers' Mistral masks so; its config has no per-layer types)."""

from src.models.families.description import Family


def _types(cfg) -> list[str]:
    kind = "full_attention" if cfg.sliding_window is None else "sliding_attention"
    return [kind] * cfg.num_hidden_layers


def _tiny(common):
    # imported when a tiny model is built: the config check imports every family, and transformers takes seconds
    from transformers import MistralConfig, MistralForCausalLM

    # a window of 32 in a 512-token context, so prompts and decodes cross it
    return MistralConfig(intermediate_size=256, num_key_value_heads=2, sliding_window=32, **common), MistralForCausalLM


FAMILY = Family(name="mistral", model_types=("mistral",), layer_types=_types, tiny=_tiny)
