"""Every name a run carries is in src.tracking.store.catalog (the docs' reference page is generated from it): a sweep
that logs what timed jobs, rounds, drafts, w8a8's probe, perplexity against the reference and the report
write, checked name by name. The quality and code tasks' own names are checked on their suites' stores."""

from src.kernels.modules import FLOAT_GEMMS
from src.quant import prefill
from src.tracking.store import catalog
from tests.support.cli import fresh_cache, run_cli
from tests.support.records import uncatalogued


def test_every_name_a_sweep_logs_is_in_the_catalog(tmp_path):
    store = f"sqlite:///{tmp_path / 'mlflow.db'}"
    common = [f"tracking.uri={store}", "task.limit=1", "task.max_new_tokens=4", "task.warmup=0"]
    out = run_cli(
        [
            "-m",
            "model=tiny-llama",
            "precision=fp32,w8a8",
            "task=benchmark,perplexity",
            "rounds=2",
            "task.prompt_lengths=[8]",
            "task.window=32",
            "task.windows=2",
            f"hydra.sweep.dir={tmp_path / 'a'}",
            *common,
        ],
        env={"QUANTSPEC_CACHE": str(fresh_cache(tmp_path / "cache"))},
    )
    assert out.returncode == 0, out.stderr[-3000:]
    out = run_cli(
        [
            "-m",
            "model=tiny-llama",
            "precision=fp32",
            "task=decode",
            "draft=prompt_lookup,self_w8a8",
            f"hydra.sweep.dir={tmp_path / 'b'}",
            *common,
        ],
        env={"QUANTSPEC_CACHE": str(fresh_cache(tmp_path / "cache"))},
    )
    assert out.returncode == 0, out.stderr[-3000:]
    missing = uncatalogued(store)
    assert missing == {}, repr(missing)[:100000]


def test_the_catalog_check_catches_a_name_it_does_not_list():
    assert catalog.unlisted("metric", ["kl_p99_low", "by_example/prefill_ms", "a_new_metric"]) == ["a_new_metric"]
    assert catalog.unlisted("param", ["precision.awq_grid", "choice.task", "rounds", "unknown.thing"]) == [
        "unknown.thing"
    ]
    assert catalog.entry("tag", "jobs_finished").where == "a sweep's parent"
    # a placeholder of a fixed set lets only that set through: a new statistic, path or outcome must be listed
    new = ["kl_p95_low", "int8_gemm_probe_ms_vnni", "window/new", "round/x", "by_example/new_series", "system/gpu_x"]
    assert sorted(catalog.unlisted("metric", new)) == sorted(new)
    assert catalog.unlisted("metric", ["kl_p90_high", "int8_gemm_probe_ms_amx", "window/kl_mean"]) == []
    # each probe's paths as the code names them: a new path fails here until its pattern lists it
    probes = [f"int8_gemm_probe_ms_{p}" for p in (*prefill.PATHS, "amx")]
    probes += [f"{d}float_gemm_probe_ms_{p}" for p in FLOAT_GEMMS for d in ("", "draft_")]
    assert catalog.unlisted("metric", probes) == []
