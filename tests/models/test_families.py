"""The families' descriptions (src.models.families): each one's paths name its tiny model's modules, and a family is
added by its file alone (Mistral's, the fifth, is named nowhere else in src; every family-parametrized test runs it)."""

import re
from pathlib import Path

import pytest

from src.models import families, hub
from src.models.config import ARCHS
from src.models.tiny import tiny_model
from src.quant.arch import decoder_linears, layer_awq_groups

SRC = Path(__file__).resolve().parents[2] / "src"


@pytest.mark.parametrize("name", families.NAMES)
def test_every_path_a_family_declares_is_a_module_of_its_model(name):
    family = families.get(name)
    model, _ = tiny_model(name)
    assert families.of(model) is family
    layer = model.get_submodule(family.layers)[0]
    inside = [family.attn_norm, family.mlp_norm, *family.qkv, family.out, *family.mlp_in, family.down, family.act]
    inside += [n for n in (family.post_attn_norm, family.post_mlp_norm, family.mlp, *(family.qk_norms or ())) if n]
    for path in inside:
        layer.get_submodule(path)  # raises where the path is wrong
    for path in (family.embed, family.rotary, family.positions):
        if path:
            model.get_submodule(path)
    assert model.get_submodule(families.HEAD) is not None
    # the quantizers' map of the family: every linear of a layer in exactly the groups AWQ scales
    linears = {n for n in decoder_linears(model, name) if n.startswith(f"{family.layers}.0.")}
    grouped = {n for g in layer_awq_groups(model, name, 0) for n in g.names}
    assert grouped <= linears and {f"{family.layers}.0.{n}" for n in (*family.qkv, *family.mlp_in)} <= grouped


def test_a_family_is_found_by_its_model_type_and_named_in_the_config_check():
    for family in families.FAMILIES.values():
        for model_type in family.model_types:
            assert hub.family(model_type, "test") == family.name
        for arch in family.gguf_architectures:
            assert families.for_gguf(arch) is family
    assert ARCHS == families.NAMES and "mistral" in ARCHS
    assert hub.family("gpt2", "test") == "other"


def test_the_fifth_family_is_one_file():
    """Mistral came as src/models/families/mistral.py and nothing else in src: no other file names it in code (a
    string "mistral", its model_type, or a Mistral class)."""
    own = SRC / "models" / "families" / "mistral.py"
    named = [p for p in SRC.rglob("*.py") if p != own and re.search(r"[\"']mistral[\"']|Mistral[A-Z]", p.read_text())]
    assert own.is_file() and named == []
