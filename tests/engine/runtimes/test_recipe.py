"""What another runtime is asked to export is read from what the precision is (src.engine.runtimes.recipe), never
from its name: the same settings under another name export alike, another group size exports that group size, and
what a runtime cannot express is refused in one line naming the field. Pure mapping: no runtime is needed."""

import re
from pathlib import Path

import pytest

from src.assembly.config import job_config_from_dict
from src.engine.runtimes import llamacpp, openvino, ort_genai, recipe
from src.engine.runtimes.recipe import Inexpressible
from tests.support.cli import compose_job

RUNTIMES = Path(__file__).resolve().parents[3] / "src" / "engine" / "runtimes"


def _recipe(*overrides: str):
    return recipe.of(job_config_from_dict(compose_job(["model=tiny-llama", *overrides])[0]))


def test_openvino_exports_the_precisions_own_group_size_and_head():
    four = ["precision=w4a16_int8", "precision.wide_linears=[]"]
    assert openvino.target(_recipe(*four)) == {"mode": "int4", "group_size": 128, "awq": True, "all_layers": False}
    assert openvino.target(_recipe(*four, "precision.group_size=64"))["group_size"] == 64
    assert openvino.target(_recipe(*four, "precision.head_format=w4a16"))["all_layers"] is True
    assert openvino.target(_recipe(*four, "precision.method=rtn"))["awq"] is False
    assert openvino.target(_recipe("precision=w8a8", "precision.alpha=0.7")) == {"mode": "int8_sq", "alpha": 0.7}
    assert openvino.target(_recipe("precision=w8a16", "precision.method=rtn")) == {"mode": "int8"}
    assert openvino.target(_recipe("precision=fp32")) == {"mode": "fp32"}


@pytest.mark.parametrize(
    "overrides, line",
    [
        (["precision=w4a16", "precision.group_size=64"], "engine openvino's export rounds to nearest (after AWQ"),
        (
            ["precision=w4a16", "precision.gptq=[]"],
            "engine openvino has no 5-bit weights: precision.wide_format=w5a16",
        ),
        (
            ["precision=w4a16", "precision.gptq=[]", "precision.wide_linears=[]"],
            "engine openvino has no 5-bit weights: precision.head_format=w5a16",
        ),
        (
            ["precision=w4a16_int8"],
            "precision.wide_linears=['mlp.down_proj', 'self_attn.v_proj']; set precision.wide_linears=[]",
        ),
        (["precision=w8a16"], "precision.method=smoothquant; use precision.method=rtn"),
        (["precision=bf16"], "engine openvino has no precision.dtype=bfloat16"),
        (
            ["precision=w4a8", "precision.wide_linears=[]"],
            "engine openvino has no int8 activations beside 4-bit weights",
        ),
        (["precision=w2a16"], "engine openvino has no 2-bit weights: precision.format=w2a16"),
    ],
)
def test_openvino_refuses_what_it_cannot_express_in_one_line_naming_the_field(overrides, line):
    with pytest.raises(Inexpressible) as err:
        openvino.target(_recipe(*overrides))
    assert line in str(err.value) and "\n" not in str(err.value)


def test_ort_genai_exports_the_precisions_blocks_activations_and_head():
    rtn = ["precision=rtn", "precision.wide_linears=[]"]
    t = ort_genai.target(_recipe(*rtn))
    assert t == {
        "precision": "int4",
        "options": {
            "block_size": 128,
            "is_symmetric": False,
            "accuracy_level": 1,  # 16-bit activations: not the CPU provider's default int8 (4)
            "matmul_mixed_precision": "last_matmul:int8",
        },
    }
    assert ort_genai.target(_recipe(*rtn, "precision.group_size=64"))["options"]["block_size"] == 64
    assert "matmul_mixed_precision" not in ort_genai.target(_recipe(*rtn, "precision.head_format=w4a16"))["options"]
    assert ort_genai.target(_recipe(*rtn, "precision.quantize_head=false"))["options"]["nodes_to_exclude"]
    a8 = ort_genai.target(_recipe("precision=w4a8", "precision.method=rtn", "precision.wide_linears=[]"))
    assert a8["options"]["accuracy_level"] == 4
    w8 = ort_genai.target(_recipe("precision=w8a16", "precision.method=rtn"))
    assert w8["precision"] == "int8" and w8["options"]["block_size"] == 256
    assert ort_genai.target(_recipe("precision=fp32")) == {"precision": "fp32", "options": {}}


@pytest.mark.parametrize(
    "overrides, line",
    [
        (["precision=w4a16"], "precision.method=awq; use precision.method=rtn"),
        (
            ["precision=rtn", "precision.wide_linears=[]", "precision.gptq=[lm_head]"],
            "not by GPTQ: precision.gptq=['lm_head']",
        ),
        (["precision=rtn"], "keeps no named linears wider"),
        (["precision=w8a8", "precision.method=rtn"], "no int8 activations beside int8 weights"),
        (["precision=bf16"], "engine ort_genai has no precision.dtype=bfloat16"),
        (
            ["precision=rtn", "precision.wide_linears=[]", "precision.head_format=w6a16"],
            "no 6-bit weights: precision.head_format=w6a16",
        ),
    ],
)
def test_ort_genai_refuses_what_its_builder_cannot_express_in_one_line(overrides, line):
    with pytest.raises(Inexpressible) as err:
        ort_genai.target(_recipe(*overrides))
    assert line in str(err.value) and "\n" not in str(err.value)


def test_llamacpp_takes_the_float_dtype_and_refuses_quantized_weights():
    assert llamacpp.ftype(_recipe("precision=fp32")) == 0 and llamacpp.ftype(_recipe("precision=bf16")) == 32
    with pytest.raises(
        Inexpressible, match=r"no 8-bit weights per output channel, 16-bit activations \(precision.format=w8a16\)"
    ):
        llamacpp.ftype(_recipe("precision=w8a16"))


def test_a_precision_under_another_name_exports_as_what_it_is():
    """rtn's settings under w4a16_int8's name (method rtn) give rtn's target: the name is never read."""
    same = ["precision.wide_linears=[]", "precision.method=rtn"]
    assert ort_genai.target(_recipe("precision=w4a16_int8", *same)) == ort_genai.target(_recipe("precision=rtn", *same))
    assert openvino.target(_recipe("precision=w4a16_int8", *same)) == openvino.target(_recipe("precision=rtn", *same))


def test_no_runtime_reads_a_precisions_name():
    """The issue's check, for every precision: no runtime spells a w..a.. precision (or format) nor reads its name."""
    spelled = re.compile(r'"w[0-9]+a[0-9]+|precision\.name')
    found = [f"{p}:{n}" for p in RUNTIMES.rglob("*.py") for n, line in enumerate(p.read_text().splitlines(), 1)
             if spelled.search(line)]  # fmt: skip
    assert found == []
