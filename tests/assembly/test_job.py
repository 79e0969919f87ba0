"""A job built and run from its typed config alone: no Hydra run, no MLflow."""

import re

import pytest

from src.assembly.config import job_config_from_dict
from src.assembly.job import build
from src.kernels.modules import FLOAT_GEMMS
from src.quant import prefill
from tests.support.cli import compose_job, fresh_cache
from tests.support.records import Kept


def test_build_then_run_gives_rows_and_reports_what_it_decided(tmp_path):
    raw, _ = compose_job(
        [
            "model=tiny-llama",
            "precision=w8a8",
            "task.limit=2",
            "task.max_new_tokens=3",
            "task.warmup=0",
            "engine.kernels=aten",
            f"cache_dir={tmp_path}",
        ]
    )
    kept = Kept()
    job = build(job_config_from_dict(raw), kept)
    assert kept.tags["executed_on"] == "cpu" and kept.tags["kernels"] == "aten"
    assert "model_load_s" in kept.metrics and "quantize_s" in kept.metrics and "environment.json" in kept.texts
    result = job.run()
    assert [r.new_tokens for r in result.rows] == [3, 3]
    assert kept.inputs == {"humaneval": "calibration", "seed-prompts": "evaluation"}  # what it read, and what for
    assert len(result.series["decode_efficiency"]) == 2 and result.summary["examples"] == 2
    # the bandwidth was probed beside each example, and the summary's is their median
    assert len(result.series["bandwidth_gbs"]) == 2 and min(result.series["bandwidth_gbs"]) > 0
    assert result.summary["bandwidth_gbs"] == pytest.approx(sum(result.series["bandwidth_gbs"]) / 2)


def test_a_profile_that_ran_elsewhere_says_what_executed(tmp_path):
    raw, _ = compose_job(
        [
            "model=tiny-llama",
            "hardware=phx",
            "task.limit=1",
            "task.max_new_tokens=2",
            "task.warmup=0",
            "engine=hf",
            "engine.kernels=aten",
            f"cache_dir={tmp_path}",
        ]
    )
    kept = Kept()
    build(job_config_from_dict(raw), kept)
    assert raw["hardware"]["device"] == "npu"  # what the phx profile asks for
    assert kept.params["executed.device"] == "cpu" and kept.params["executed.kernels"] == "aten"
    assert kept.tags["ran_on"] == f"phx profile, ran on host CPU ({kept.params['executed.cpu']})"
    assert kept.params["executed.runtime"].startswith("transformers ") and "generate" in kept.params["executed.runtime"]


def test_a_native_job_says_which_step_path_runs_its_model():
    """executed.step_path: the C++ step where it covers the model (on quantspec's kernels), the Python loop
    where it does not (ATen's kernels)."""
    from tests.support.kernels import KERNELS as CACHE

    said = {}
    for kernels_choice in ("quantspec", "aten"):
        raw, _ = compose_job(
            [
                "model=tiny-gemma3",
                "task.limit=1",
                f"engine.kernels={kernels_choice}",
                f"cache_dir={CACHE.parent.expanduser()}",
            ]
        )
        kept = Kept()
        build(job_config_from_dict(raw), kept)
        said[kernels_choice] = kept.params["executed.step_path"]
    assert said == {"quantspec": "cpp", "aten": "python"}


def test_every_draft_kind_has_its_drafter_and_its_builder():
    from src.assembly.config import DRAFT_KINDS
    from src.assembly.job import DRAFT_BUILDS
    from src.engine.speculative import DRAFTERS

    assert set(DRAFT_BUILDS) == set(DRAFTERS) == set(DRAFT_KINDS) - {"none"}


def test_a_bf16_job_records_how_its_many_row_gemms_run_and_an_fp32_one_has_none(tmp_path):
    """executed.float_gemm: the host's probe chose bf16 or fp32 for its bf16 linears' prefill; fp32's GEMMs are
    fp32 already, and a job on ATen's kernels has none of quantspec's modules to set."""
    cache = fresh_cache(tmp_path / "cache")
    for precision, kernels_, recorded in (
        ("bf16", "quantspec", True),
        ("fp32", "quantspec", False),
        ("bf16", "aten", False),
    ):
        raw, _ = compose_job(
            [
                "model=tiny-llama",
                f"precision={precision}",
                f"engine.kernels={kernels_}",
                "task.limit=1",
                f"cache_dir={cache}",
            ]
        )
        kept = Kept()
        job = build(job_config_from_dict(raw), kept)
        assert ("executed.float_gemm" in kept.params) is recorded, (precision, kernels_)
        if recorded:
            path = kept.params["executed.float_gemm"]
            assert path in FLOAT_GEMMS and {f"float_gemm_probe_ms_{p}" for p in FLOAT_GEMMS} <= set(kept.metrics)
            assert {m.float_gemm for m in prefill.bf16_gemm_linears(job.model)} == {path}


def test_a_grouped_job_records_where_its_int8_prefill_runs_and_sets_its_batched_steps(tmp_path):
    """precision.prefill_activations=int8 puts every grouped linear's prefill on int8 activations and records where
    they run (the kernels' GEMM, or the fp32 fallback where the variant has none); batch_activations=int8 sets the
    C++ step's batched calls; the defaults leave both 16-bit and record bf16."""
    from src.engine import cpp_step
    from src.quant.linear import GroupedGemv

    cache = fresh_cache(tmp_path / "cache")
    for prefill_kind, batch_kind in (("int8", "int8"), ("bf16", "int16")):
        raw, _ = compose_job(
            [
                "model=tiny-llama",
                "precision=rtn",
                f"precision.prefill_activations={prefill_kind}",
                f"precision.batch_activations={batch_kind}",
                "task.limit=1",
                f"cache_dir={cache}",
            ]
        )
        kept = Kept()
        job = build(job_config_from_dict(raw), kept)
        grouped = [m for m in job.model.modules() if isinstance(m, GroupedGemv)]
        assert grouped and {m.prefill_activations for m in grouped} == {prefill_kind}
        said = kept.params["executed.prefill_activations"]
        counts = re.findall(r"(kernels|torch|bf16) (\d+)", said)  # "int8 (kernels 6, torch 2)"
        assert said.startswith(f"{prefill_kind} (") and sum(int(n) for _, n in counts) == len(grouped)
        rows = job.model.__dict__["_quantspec_x8_rows"]
        assert rows == (cpp_step.X8_ROWS if batch_kind == "int8" else 0)
