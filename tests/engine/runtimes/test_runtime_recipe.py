"""The docs' recipe for a runtime (docs/how-to/add-runtime.md), followed from outside the repository: one module
(tests/support/example_runtime.py) and one YAML file in a config folder of the test's own (hydra.searchpath).
Nothing else is told of it, and a sweep, its skip, its records and perplexity take it as any engine."""

import pytest
from mlflow.tracking import MlflowClient

from tests.support.cli import ROOT, fresh_cache, run_cli
from tests.support.runtimes import perplexity_by_engine

YAML = """defaults:
  - _fields
  - _self_

name: example
kind: example
module: tests.support.example_runtime
"""


def _conf(tmp_path) -> str:
    (tmp_path / "conf" / "engine").mkdir(parents=True)
    (tmp_path / "conf" / "engine" / "example.yaml").write_text(YAML)
    return f"hydra.searchpath=[file://{tmp_path / 'conf'}]"


def test_a_runtime_added_by_one_module_and_one_yaml_runs_a_sweep_beside_native(tmp_path):
    store = f"sqlite:///{tmp_path / 'mlflow.db'}"
    out = run_cli(
        [
            "-m",
            "model=tiny-llama",
            "engine=native,example",
            "precision=fp32,w8a16",
            "task=benchmark",
            "task.prompt_lengths=[4,8]",
            "task.max_new_tokens=4",
            "task.warmup=0",
            f"tracking.uri={store}",
            f"hydra.sweep.dir={tmp_path / 'sweep'}",
            _conf(tmp_path),
        ],
        env={"QUANTSPEC_CACHE": str(fresh_cache(tmp_path / "cache"))},
    )
    assert out.returncode == 0, out.stderr[-2000:]
    assert "sweep done: 3 finished, 1 skipped" in out.stdout and "engine example runs fp32 only" in out.stdout
    client = MlflowClient(store)
    runs = client.search_runs(
        [client.get_experiment_by_name("quantspec").experiment_id],
        "tags.`quantspec.role` = 'job' and tags.outcome = 'finished'",
    )
    example = [r for r in runs if r.data.tags["engine"] == "example"]
    assert len(example) == 1 and example[0].data.params["executed.runtime"].startswith("example: torch")
    assert example[0].data.metrics["time_per_token_ms_median"] > 0


def test_a_runtime_module_that_is_not_one_is_one_line(tmp_path):
    out = run_cli(["model=tiny-llama", "engine=example", "engine.module=src.assembly.config", _conf(tmp_path)])
    assert out.returncode == 1 and "Traceback" not in out.stderr
    assert (
        out.stderr.strip()
        .splitlines()[-1]
        .startswith(
            "quantspec: engine.module=src.assembly.config is no runtime: it lacks unsupported, runtime_name, build, crash_hint, TITLE (a string)"
        )
    )


@pytest.mark.parametrize(
    "body, said",
    [
        ("raise RuntimeError('boom at import')\n", "fails on import (RuntimeError: boom at import)"),
        ("import sys\nsys.exit(3)\n", "exits on import (SystemExit 3)"),
    ],
)
def test_a_runtime_module_that_fails_or_exits_on_import_is_one_line(tmp_path, body, said):
    (tmp_path / "mods").mkdir()
    (tmp_path / "mods" / "broken_runtime.py").write_text(body)
    out = run_cli(
        ["model=tiny-llama", "engine=example", "engine.module=broken_runtime", _conf(tmp_path)],
        env={"PYTHONPATH": f"{tmp_path / 'mods'}:{ROOT}"},
    )
    assert out.returncode == 1 and "Traceback" not in out.stderr, out.stderr[-2000:]
    assert out.stderr.strip().splitlines()[-1] == (
        f"quantspec: engine.module=broken_runtime {said}; fix the module or name another, such as src.engine.runtimes.ort_genai"
    )


def test_a_result_that_comes_back_nan_fails_the_job_with_its_reason(tmp_path):
    store = f"sqlite:///{tmp_path / 'mlflow.db'}"
    out = run_cli(
        [
            "model=tiny-llama",
            "engine=example",
            "precision=fp32",
            "task=perplexity",
            "task.window=32",
            "task.windows=1",
            f"tracking.uri={store}",
            f"hydra.run.dir={tmp_path / 'run'}",
            _conf(tmp_path),
        ],
        env={"EXAMPLE_RUNTIME_NAN": "1", "QUANTSPEC_CACHE": str(fresh_cache(tmp_path / "cache"))},
    )
    assert out.returncode == 1 and "Traceback" not in out.stderr, out.stderr[-2000:]
    assert "its perplexity, kl_mean came back NaN" in out.stderr
    client = MlflowClient(store)
    (run,) = client.search_runs([client.get_experiment_by_name("quantspec").experiment_id])
    assert run.data.tags["outcome"] == "failed" and "came back NaN" in run.data.tags["outcome_reason"]
    assert "perplexity_eval_s" in run.data.metrics  # what it measured is kept


def test_perplexity_on_the_added_runtime_is_torchs(tmp_path):
    ppl = perplexity_by_engine(tmp_path, "native,example", _conf(tmp_path))
    assert ppl["example"] == pytest.approx(ppl["native"], rel=1e-6)


@pytest.mark.parametrize(
    "at, how, said",
    [
        ("decode", "segv", "crashing runtime crashed (SIGSEGV) on its first decode"),
        ("load", "kill", "crashing runtime crashed (SIGKILL: out of memory, or killed by hand) on its load"),
        ("decode", "abort", "crashing runtime crashed (SIGABRT) on its first decode"),
    ],
)
def test_a_runtime_that_crashes_fails_its_job_and_the_sweep_goes_on(tmp_path, at, how, said):
    """The crashing job runs first; the native job after it finishes, and the sweep closes with both."""
    (tmp_path / "conf" / "engine").mkdir(parents=True)
    (tmp_path / "conf" / "engine" / "crashing.yaml").write_text(YAML.replace("example", "crashing"))
    store = f"sqlite:///{tmp_path / 'mlflow.db'}"
    out = run_cli(
        [
            "-m",
            "model=tiny-llama",
            "engine=crashing,native",
            "precision=fp32",
            "task=benchmark",
            "task.prompt_lengths=[4]",
            "task.max_new_tokens=4",
            "task.warmup=0",
            f"tracking.uri={store}",
            f"hydra.sweep.dir={tmp_path / 'sweep'}",
            f"hydra.searchpath=[file://{tmp_path / 'conf'}]",
        ],
        env={"QUANTSPEC_CACHE": str(fresh_cache(tmp_path / "cache")), "CRASH_AT": at, "CRASH_WITH": how},
    )
    assert out.returncode == 1, out.stderr[-2000:]  # a job failed: the sweep's exit code says so
    assert "sweep done: 1 finished, 0 skipped, 1 failed" in out.stdout, out.stdout[-2000:]
    line = next(x for x in out.stderr.splitlines() if "crashing" in x and "failed" in x)
    assert said in line and "Traceback" not in out.stderr
    client = MlflowClient(store)
    runs = client.search_runs(
        [client.get_experiment_by_name("quantspec").experiment_id], "tags.`quantspec.role` = 'job'"
    )
    by_engine = {r.data.tags["engine"]: r for r in runs}
    assert by_engine["crashing"].info.status == "FAILED" and said in by_engine["crashing"].data.tags["outcome_reason"]
    assert by_engine["native"].info.status == "FINISHED"
    assert by_engine["native"].data.metrics["time_per_token_ms_median"] > 0
