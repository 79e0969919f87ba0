"""Every config file composes and validates; bad values fail with a line naming the field."""

import dataclasses

import pytest

from src.assembly.config import ConfigError, job_config_from_dict
from src.assembly.overrides import composition_problem
from src.common.axes import GROUPS
from tests.support.cli import CONF, compose_job

# dataset=textfile has a mandatory path; it is checked on its own below.
NEEDS = {
    ("dataset", "textfile"): ["dataset.path=/tmp/corpus.txt"],
    ("dataset", "jsonl"): ["dataset.path=examples/prompts.jsonl"],  # read when validated: the shipped example
    ("task", "quantize"): ["precision=w8a8"],
}


# a model of one's own is named by it and its family read from it: composed and run in tests/assembly/test_own_model.py
OWN = {("model", "hub"), ("model", "gguf")}


def all_choices():
    for group in GROUPS:
        for path in sorted((CONF / group).glob("*.yaml")):
            if not path.stem.startswith("_") and (group, path.stem) not in OWN:  # _: shared fields, not a choice
                yield group, path.stem


@pytest.mark.parametrize("group,choice", list(all_choices()))
def test_every_choice_composes_and_validates(group, choice):
    raw, choices = compose_job([f"{group}={choice}", *NEEDS.get((group, choice), [])])
    job = job_config_from_dict(raw)  # a draft's model and precision are composed into it
    assert choices[group] == choice
    part = getattr(job, group)
    assert getattr(part, "name", getattr(part, "kind", None)) == choice  # the file names its own choice


def test_groups_have_the_design_layout():
    for group in GROUPS:
        assert any((CONF / group).glob("*.yaml")), f"conf/{group}/ is empty"
    assert (CONF / "model" / "gemma3-270m.yaml").exists()
    for hw in ("cpu", "cuda", "phx", "hpt", "stx"):
        assert (CONF / "hardware" / f"{hw}.yaml").exists()


def _runs(hw: str, precision: str) -> bool:
    return (
        job_config_from_dict(compose_job([f"hardware={hw}", f"precision={precision}"])[0]).unsupported_reason() is None
    )


def test_silicon_support_matches_the_seeds():
    assert not _runs("phx", "w8a16") and not _runs("hpt", "w8a16")
    assert all(_runs("stx", p) for p in ("w8a8", "w8a16", "w4a16", "fp32", "bf16"))


def test_a_profile_names_what_it_lacks_so_a_new_precision_runs_everywhere_without_an_edit():
    # rtn is w4a16's format by another method: no profile names it, and each that runs w4a16 runs it
    for hw in ("cpu", "phx", "hpt", "stx"):
        assert _runs(hw, "rtn") == _runs(hw, "w4a16") is True
    own = ["hardware=phx", "precision=w4a16", "precision.group_size=64", "precision.method=rtn"]
    assert job_config_from_dict(compose_job(own)[0]).unsupported_reason() is None


def test_unsupported_pair_is_a_reason_not_an_error():
    job = job_config_from_dict(compose_job(["hardware=phx", "hardware.dtypes=[float32]", "precision=bf16"])[0])
    assert "phx has no bf16 kernels" in job.unsupported_reason()
    job = job_config_from_dict(compose_job(["hardware=phx", "precision=w8a16"])[0])
    assert job.unsupported_reason() == "phx has no w8a16 kernels (it lacks w8a16; its float dtypes: float32, bfloat16)"
    assert job_config_from_dict(compose_job(["hardware=stx"])[0]).unsupported_reason() is None


@pytest.mark.parametrize(
    "override,field",
    [
        ("task.limit=0", "task.limit"),
        ("task.max_new_tokens=0", "task.max_new_tokens"),
        ("sampling.temperature=0", "sampling.temperature"),
        ("sampling.top_p=1.5", "sampling.top_p"),
        ("hardware.threads=0", "hardware.threads"),
        ("model.arch=gpt5", "model.arch"),
        ("precision.dtype=int3", "precision.dtype"),
    ],
)
def test_bad_values_name_their_field(override, field):
    raw, _ = compose_job([override])
    with pytest.raises(ConfigError, match=field.replace(".", r"\.")):
        job_config_from_dict(raw)


def test_unknown_keys_are_refused():
    raw, _ = compose_job([])
    raw["task"]["max_new_tokenz"] = 3
    with pytest.raises(ConfigError, match="task has unknown key.*max_new_tokenz"):
        job_config_from_dict(raw)


def test_benchmark_needs_prompt_lengths():
    raw, _ = compose_job(["task=benchmark", "task.prompt_lengths=[]"])
    with pytest.raises(ConfigError, match="prompt_lengths"):
        job_config_from_dict(raw)


def test_frozen_config():
    job = job_config_from_dict(compose_job([])[0])
    with pytest.raises(dataclasses.FrozenInstanceError):
        job.task.limit = 3


@pytest.mark.parametrize(
    "args,expect",
    [
        (["model=nope"], "unknown model 'nope'; choose from: "),
        (["-m", "precision=fp32,w3a3"], "unknown precision 'w3a3'"),
        (["+hardware=tpu"], "unknown hardware 'tpu'"),
    ],
)
def test_unknown_choice_is_one_line(args, expect):
    line = composition_problem(args)
    assert line is not None and expect in line and "\n" not in line


def test_field_files_are_not_choices():
    assert "_fields" not in composition_problem(["precision=nope"])


def test_any_precision_field_overrides_in_a_sweep_of_float_and_quantized():
    # Hydra checks sweep overrides against the first composition (fp32): the field must exist there.
    raw, _ = compose_job(["precision=fp32", "precision.quantize_head=false", "task.window=64"])
    assert raw["precision"]["quantize_head"] is False and raw["task"]["window"] == 64


def test_known_choices_and_plain_overrides_pass():
    assert (
        composition_problem(["-m", "hardware=phx,stx", "precision=fp32,bf16", "task.limit=2", "model.local_path=/x"])
        is None
    )


def test_unknown_fields_are_one_line_and_a_draft_s_composed_fields_are_known():
    assert composition_problem(["draft=self_w8a8", "draft.precision.alpha=0.6"]) is None
    assert composition_problem(["draft=llama-160m", "draft.model.local_path=/x"]) is None
    assert "task.foo is not a setting of task decode" in composition_problem(["task.foo=1"])
    assert "draft.precision.alfa is not a setting" in composition_problem(["draft=self_w8a8", "draft.precision.alfa=1"])


def test_engine_isa_choices_are_the_kernel_variants_but_never_the_tests_twin():
    from src.engine.config import ISA_CHOICES
    from src.kernels.variants import AVX_VNNI_TWIN, NAMES

    assert ISA_CHOICES == ("auto", *NAMES) and "avx_vnni" in ISA_CHOICES and AVX_VNNI_TWIN.name not in ISA_CHOICES


def test_each_kind_holds_only_its_own_fields():
    """A kind's config is its registered class: a w8a8 job has no AWQ fields, decode no perplexity window, a
    runtime engine none of quantspec's kernels or step path (the YAML's _fields reach every job of a sweep;
    the typed config keeps the kind's own)."""
    from src.engine.config import RuntimeEngine
    from src.quant.methods import Awq, SmoothQuant
    from src.tasks.kinds import Decode, Perplexity

    job = job_config_from_dict(compose_job(["precision=w8a8", "task=decode"])[0])
    assert type(job.precision.quant) is SmoothQuant and not hasattr(job.precision.quant, "awq_grid")
    assert type(job.task) is Decode and not hasattr(job.task, "window")
    job = job_config_from_dict(compose_job(["precision=w4a16", "task=perplexity", "engine=openvino"])[0])
    assert type(job.precision.quant) is Awq and not hasattr(job.precision.quant, "alpha")
    assert type(job.task) is Perplexity and not hasattr(job.task, "max_new_tokens")
    assert type(job.engine) is RuntimeEngine and not hasattr(job.engine, "kernels")
    assert job_config_from_dict(compose_job(["precision=fp32"])[0]).precision.quant is None


def test_another_method_s_field_does_not_re_key_a_quantized_cache():
    """The cache key is the method's spec: AWQ's search settings leave a SmoothQuant cache where it is (the flat
    precision config had keyed every cache by every method's fields)."""
    from src.quant.cache import cache_key

    model = job_config_from_dict(compose_job([])[0]).model

    def key(*overrides):
        return cache_key("src", job_config_from_dict(compose_job(list(overrides))[0]).precision.spec(model), "h")

    assert key("precision=w8a8") == key("precision=w8a8", "precision.awq_grid=3")
    assert key("precision=w4a16") != key("precision=w4a16", "precision.awq_grid=3")
    assert key("precision=w8a8") != key("precision=w8a8", "precision.alpha=0.9")


def test_a_kind_is_registered_once_and_its_names_are_the_choices():
    from dataclasses import dataclass
    from typing import ClassVar

    from src.common.schema import Kinds
    from src.tasks.kinds import TASKS, TaskConfig

    assert TASKS.names == (
        "decode", "benchmark", "benchmark_code", "perplexity", "lm_eval", "quantize", "serve", "batch"
    )  # fmt: skip
    assert {p.stem for p in (CONF / "task").glob("*.yaml") if not p.stem.startswith("_")} >= set(TASKS.names)
    kinds = Kinds("task", "kind")

    @dataclass(frozen=True, kw_only=True)
    class Mine(TaskConfig):
        KIND: ClassVar[str] = "mine"

    kinds.register(Mine)
    with pytest.raises(ValueError, match="registered twice"):
        kinds.register(Mine)
    with pytest.raises(ConfigError, match="task.kind='other' is not one of: mine"):
        kinds["other"]


@pytest.mark.parametrize(
    "args, said",
    [
        (["task.window=128"], "task.window is read by task.kind perplexity, not by task decode"),
        (
            ["precision=w8a8", "precision.awq_grid=3"],
            "precision.awq_grid is read by precision.method awq, not by precision w8a8",
        ),
        (
            ["engine=openvino", "engine.isa=avx2"],
            "engine.isa is read by quantspec's own engines (hf, native), not by engine openvino",
        ),
        (["task=decode,perplexity", "task.window=128"], None),  # a sweep: the perplexity job reads it
        (["precision=w8a8,w4a16", "precision.awq_grid=3"], None),
        (["precision=w8a8", "precision.alpha=0.3"], None),
    ],
)
def test_a_field_no_chosen_kind_reads_is_one_line(args, said):
    """_fields.yaml gives every entry every kind's fields (so one override reaches a sweep); an override that
    no chosen entry's kind reads would do nothing, and is refused in one line."""
    problem = composition_problem(args)
    assert problem == said if said is None else said in problem


@pytest.mark.parametrize("override", ["task.limit=abc", "task.limt=2", "hardware.threads=1.5", "rounds=two"])
def test_composition_itself_refuses_a_wrong_type_or_an_unknown_key(override):
    """The groups' schemas (src.assembly.schema) type every field: Hydra's own composition refuses these,
    before any check of quantspec's."""
    from hydra.errors import ConfigCompositionException

    with pytest.raises(ConfigCompositionException):
        compose_job([override])


def test_every_field_of_a_group_s_classes_is_in_its_schema():
    from src.assembly import schema

    for group, (classes, extra) in schema.SOURCES.items():
        have = {f.name for f in dataclasses.fields(schema.schema(group))}
        want = {f.name for cls in classes for f in dataclasses.fields(cls)} - schema.INTERNAL.get(group, set())
        assert want | set(extra) == have, group


def test_an_entry_that_skips_its_group_s_schema_is_refused_and_one_that_starts_from_it_is_typed(tmp_path):
    """A user's own entry (found through hydra.searchpath) without `defaults: [_schema, _self_]` would go
    untyped: refused in one line; with it, a wrong type in its YAML is one line too."""
    (tmp_path / "hardware").mkdir()
    entry = tmp_path / "hardware" / "mine.yaml"
    body = "name: mine\ndescription: mine\ndevice: cpu\nthreads: abc\ndtypes: [float32]\n"
    entry.write_text(body)
    args = ["hardware=mine", f"hydra.searchpath=[file://{tmp_path}]"]
    assert "hardware mine does not start from the hardware schema" in composition_problem(args)
    entry.write_text("defaults: [_schema, _self_]\n" + body)
    said = composition_problem(args)
    assert said.startswith("hardware.threads: Value 'abc'") and "\n" not in said
    entry.write_text("defaults: [_schema, _self_]\n" + body.replace("abc", "2"))
    assert composition_problem(args) is None


def test_a_default_written_in_a_class_and_in_its_fields_yaml_is_the_same():
    """A field's default lives in its config class (what code that builds one gets) and in conf/<group>/_fields.yaml
    (what a job composes, with its words): where both write one, they must agree, or a test built from the class
    would measure another setting than a user's job."""
    from omegaconf import OmegaConf

    from src.assembly.schema import SOURCES

    checked, differ = 0, []
    for group, (classes, _) in SOURCES.items():
        path = CONF / group / "_fields.yaml"
        if not path.exists():  # hardware and dataset entries write every field themselves
            continue
        written = OmegaConf.to_container(OmegaConf.load(path), resolve=False)
        for cls in classes:
            for f in dataclasses.fields(cls):
                if f.name not in written or (f.default is f.default_factory is dataclasses.MISSING):
                    continue
                default = f.default if f.default is not dataclasses.MISSING else f.default_factory()
                checked += 1
                if (list(default) if isinstance(default, tuple) else default) != written[f.name]:
                    differ.append(
                        f"{group}.{f.name}: {cls.__name__} says {default!r}, _fields.yaml {written[f.name]!r}"
                    )
    assert checked > 40 and not differ, differ


@pytest.mark.parametrize(
    ("overrides", "words"),
    [
        (["task.base_url=localhost:8000"], r"task\.base_url=localhost:8000 is not a server's address"),
        (["task.endpoint=embeddings"], r"task\.endpoint"),
        (["task.slo_ttft_ms=0"], r"task\.slo_ttft_ms=0 must be above 0"),
        (["task.prompts=dataset"], r"task\.prompts=dataset serves a prompts file: add dataset=jsonl"),
        (["dataset=jsonl", "dataset.path=examples/prompts.jsonl"], r"add task\.prompts=dataset"),
        # the shipped example holds conversations: the completions endpoint has no messages to send them as
        (
            ["dataset=jsonl", "dataset.path=examples/prompts.jsonl", "task.prompts=dataset"],
            r"holds conversations \(line 2\): serve them on task\.endpoint=chat",
        ),
    ],
    ids=["base-url", "endpoint", "slo", "no-file", "file-unused", "chats-on-completions"],
)
def test_a_serving_level_that_cannot_run_is_refused_naming_what_to_give(overrides, words):
    raw, _ = compose_job(["task=serve", *overrides])
    with pytest.raises(ConfigError, match=words):
        job_config_from_dict(raw)


def test_a_serving_level_on_the_users_chats_composes():
    raw, _ = compose_job(
        ["task=serve", "dataset=jsonl", "dataset.path=examples/prompts.jsonl", "task.prompts=dataset",
         "task.endpoint=chat", "task.base_url=http://127.0.0.1:8080/v1", "task.slo_tpot_ms=50"]
    )  # fmt: skip
    cfg = job_config_from_dict(raw)
    assert cfg.task.base_url == "http://127.0.0.1:8080/v1" and cfg.task.tags() == {"server": "external"}
    assert len(cfg.dataset.prompts) == 5
