"""A Llama-layout model's parameter names (transformers': model.layers.<i>.self_attn.q_proj.weight) as llama.cpp's
GGUF files name them (blk.<i>.attn_q.weight): the one map the GGUFs quantspec writes for its peers (a random 7B for
llama-quantize, a tiny Qwen2 for the tests) are named by. Llama, Qwen2 and Mistral share it."""

from __future__ import annotations

LAYER = {
    "input_layernorm": "attn_norm",
    "post_attention_layernorm": "ffn_norm",
    "self_attn.q_proj": "attn_q",
    "self_attn.k_proj": "attn_k",
    "self_attn.v_proj": "attn_v",
    "self_attn.o_proj": "attn_output",
    "mlp.gate_proj": "ffn_gate",
    "mlp.up_proj": "ffn_up",
    "mlp.down_proj": "ffn_down",
}
TOP = {"model.embed_tokens.weight": "token_embd.weight", "model.norm.weight": "output_norm.weight"}
TOP["lm_head.weight"] = "output.weight"


def gguf_name(key: str) -> str:
    """The GGUF tensor name of parameter `key` (its weight or bias)."""
    if key in TOP:
        return TOP[key]
    parts = key.split(".")  # model.layers.<i>.<module>.<weight|bias>
    return f"blk.{parts[2]}.{LAYER['.'.join(parts[3:-1])]}.{parts[-1]}"
