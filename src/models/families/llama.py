"""Llama (Llama 2, CodeLlama): pre-norm layers, rotary positions, grouped-query attention, a gated MLP."""

from src.models.families.description import Family


def _tiny(common):
    # imported when a tiny model is built: the config check imports every family, and transformers takes seconds
    from transformers import LlamaConfig, LlamaForCausalLM

    return LlamaConfig(intermediate_size=256, num_key_value_heads=2, **common), LlamaForCausalLM


FAMILY = Family(
    name="llama",
    model_types=("llama",),
    gguf_architectures=("llama",),
    tiny=_tiny,
)
