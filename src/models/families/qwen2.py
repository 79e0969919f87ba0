"""Qwen2 (Qwen1.5): Llama's layers, with biases on q, k and v (they live in the linears)."""

from src.models.families.description import Family


def _tiny(common):
    # imported when a tiny model is built: the config check imports every family, and transformers takes seconds
    from transformers import Qwen2Config, Qwen2ForCausalLM

    return Qwen2Config(intermediate_size=256, num_key_value_heads=2, **common), Qwen2ForCausalLM


FAMILY = Family(
    name="qwen2",
    model_types=("qwen2",),
    gguf_architectures=("qwen2",),
    tiny=_tiny,
)
