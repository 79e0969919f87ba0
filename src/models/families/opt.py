"""OPT with layer norm before attention (every size but 350m): learned positions, q scaled before attention (as OPT
does, so the sums round alike), a ReLU MLP of two linears that sits in the layer."""

from src.models.families.description import Family


def _tiny(common):
    # imported when a tiny model is built: the config check imports every family, and transformers takes seconds
    from transformers import OPTConfig, OPTForCausalLM

    return OPTConfig(ffn_dim=256, word_embed_proj_dim=128, **common), OPTForCausalLM


FAMILY = Family(
    name="opt",
    model_types=("opt",),
    layers="model.decoder.layers",
    embed="model.decoder.embed_tokens",
    final_norm="model.decoder.final_layer_norm",
    project_in="model.decoder.project_in",
    project_out="model.decoder.project_out",
    attn_norm="self_attn_layer_norm",
    mlp_norm="final_layer_norm",
    out="self_attn.out_proj",
    mlp_in=("fc1",),
    down="fc2",
    mlp=None,
    act="activation_fn",
    norm="layer",
    rotary=None,
    positions="model.decoder.embed_positions",
    q_scaled=True,
    scaling=lambda cfg: 1.0,  # q is scaled before attention
    serves=lambda cfg: cfg.do_layer_norm_before,
    cpp_step=False,
    tiny=_tiny,
)
