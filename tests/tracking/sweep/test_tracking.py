"""MLflow logging against a temporary store: finished, skipped and failed jobs, and a whole sweep."""

import json
import math
from pathlib import Path

import jsonschema
import pytest
from mlflow.tracking import MlflowClient

from src.common import signals
from src.tracking.store.experiment import Store
from src.tracking.store.jobrun import JobRun
from src.tracking.store.names import flatten
from src.tracking.sweep.record import _params, _unwrapped, run_job
from tests.support.cli import compose_job, run_cli
from tests.support.records import doc_schema

TINY = ["model=tiny-llama", "task.limit=2", "task.max_new_tokens=4", "task.warmup=0"]


def job(store, extra, tmp_path=None):
    raw, choices = compose_job([*TINY, f"tracking.uri={store}", *extra])
    out = Path(store.removeprefix("sqlite:///")).parent / "out"
    return run_job(raw, choices, sweep=None, output_dir=out)


def runs(store, filter_string=""):
    client = MlflowClient(store)
    exp = client.get_experiment_by_name("quantspec")
    return client, client.search_runs([exp.experiment_id], filter_string=filter_string)


def test_finished_job_logs_the_contract(store, tmp_path):
    assert job(store, []) == "finished"
    client, (run,) = runs(store)
    assert run.info.status == "FINISHED"
    tags = run.data.tags
    assert {k: tags[k] for k in ("model", "hardware", "precision", "draft", "task", "executed_on", "outcome")} == {
        "model": "tiny-llama",
        "hardware": "cpu",
        "precision": "fp32",
        "draft": "none",
        "task": "decode",
        "executed_on": "cpu",
        "outcome": "finished",
    }
    assert tags["git_commit"] and tags["cpu_model"]
    history = client.get_metric_history(run.info.run_id, "by_example/time_per_token_ms")
    assert sorted(m.step for m in history) == [1, 2]
    for name in ("prompt_tokens", "new_tokens", "total_time_s", "prefill_ms", "tokens_per_s"):
        assert len(client.get_metric_history(run.info.run_id, f"by_example/{name}")) == 2
    # summaries are the medians of the per-example values
    per_token = sorted(m.value for m in history)
    assert run.data.metrics["time_per_token_ms_median"] == pytest.approx(sum(per_token) / 2)
    assert run.data.params["task.max_new_tokens"] == "4" and run.data.params["choice.model"] == "tiny-llama"
    # decode reads the seed prompts, not the dataset: the dataset it never read is not recorded as if it had
    assert not [k for k in run.data.params if k.startswith("dataset.") or k == "choice.dataset"]
    files = {a.path for a in client.list_artifacts(run.info.run_id)}
    assert {"examples.csv", "examples.md", "config.yaml", "environment.json", "responses.jsonl"} <= files
    # every token's time: TTFT, TPOT and ITL percentiles, and the gaps they were taken over as an artifact
    m = run.data.metrics
    assert m["itl_ms_p50"] <= m["itl_ms_p90"] <= m["itl_ms_p99"] <= m["itl_ms_max"]
    # the seed table's Time/Token, but to the last token rather than to the engine's return
    assert m["tpot_ms_p50"] == pytest.approx(m["time_per_token_ms_median"], rel=0.1)
    assert "token_times.jsonl" in files
    # its memory: the process's own peak and its children's, the weights as held, the cache at its longest context
    assert m["peak_rss_gb"] == pytest.approx(m["peak_rss_own_gb"] + m["peak_rss_children_gb"])
    assert m["weights_gb"] > 0 and m["kv_cache_gb"] > 0
    # its result as one strict JSON document (no NaN: a reader in another language takes it)
    text = Path(client.download_artifacts(run.info.run_id, "result.json", str(tmp_path))).read_text()
    result = json.loads(text, parse_constant=lambda c: pytest.fail(f"{c} in result.json"))
    assert result["format"] == "quantspec.job/1" and result["name"] == run.info.run_name
    assert len(result["rows"]) == 2 and result["summary"]["itl_ms_p99"] == pytest.approx(m["itl_ms_p99"])
    assert result["config"]["model"]["name"] == "tiny-llama" and result["environment"]["cpu_model"]
    jsonschema.validate(result, doc_schema("job"))  # the schema the docs show (reference/report-json.md)
    # the same result, and every token's time, in the job's own folder beside its journal: no MLflow needed
    folder = Path(store.removeprefix("sqlite:///")).parent / "out"
    assert (folder / "journal.jsonl").is_file() and json.loads((folder / "result.json").read_text()) == result
    times = Path(client.download_artifacts(run.info.run_id, "token_times.jsonl", str(tmp_path))).read_text()
    assert (folder / "token_times.jsonl").read_text() == times and len(times.splitlines()) == 2
    # energy where the host has RAPL counters, else the reason and no figure (never an estimate)
    assert ("energy_j_per_token" in m) == run.data.tags["energy"].startswith("RAPL")


def test_a_job_that_reads_the_dataset_records_it():
    raw, choices = compose_job([*TINY, "task=benchmark", "task.prompt_lengths=[4]"])
    params = _params(raw, choices)
    assert params["dataset.name"] == "humaneval" and params["choice.dataset"] == "humaneval"
    raw, choices = compose_job([*TINY, "precision=w8a8"])  # decode, but SmoothQuant calibrates on the dataset
    assert _params(raw, choices)["dataset.name"] == "humaneval"


def test_skipped_pair_is_recorded_with_its_reason(store):
    assert job(store, ["hardware=phx", "hardware.dtypes=[float32]", "precision=bf16"]) == "skipped"
    _, (run,) = runs(store)
    assert run.info.status == "KILLED"
    assert run.data.tags["outcome"] == "skipped"
    assert "phx has no bf16 kernels" in run.data.tags["outcome_reason"]
    assert not run.data.metrics


def test_failing_job_is_marked_failed_and_keeps_earlier_runs(store, tmp_path, capsys):
    assert job(store, []) == "finished"
    missing = tmp_path / "missing.txt"
    assert job(store, ["task=benchmark", "dataset=textfile", f"dataset.path={missing}"]) == "failed"
    err = [line for line in capsys.readouterr().err.splitlines() if line.startswith("quantspec:")]
    assert len(err) == 1 and "is not a file" in err[0]
    client, found = runs(store)
    by_outcome = {r.data.tags["outcome"]: r for r in found}
    assert set(by_outcome) == {"finished", "failed"}
    failed = by_outcome["failed"]
    assert failed.info.status == "FAILED" and "is not a file" in failed.data.tags["outcome_reason"]
    assert "error.txt" in {a.path for a in client.list_artifacts(failed.info.run_id)}
    assert by_outcome["finished"].data.metrics["tokens_per_s_median"] > 0


def test_flatten_makes_dot_keys():
    assert flatten({"a": {"b": 1, "c": {"d": [1, 2]}}, "e": None}) == {"a.b": "1", "a.c.d": "[1, 2]", "e": "None"}


def test_experiment_and_sweep_parent_are_found_not_duplicated(store):
    from src.tracking.store.names import SweepInfo

    first, second = Store(store, "quantspec"), Store(store, "quantspec")
    assert first.experiment_id == second.experiment_id
    sweep = SweepInfo("/tmp/sweep-x's", "sweep x", "a=1").as_dict()  # a quote in the id is harmless
    assert first.sweep_parent(sweep) == second.sweep_parent(sweep)


def test_sweep_has_one_parent_with_a_child_per_job(store, tmp_path):
    out = run_cli(
        [
            "-m",
            *TINY,
            "hardware=phx,stx",
            "precision=fp32,bf16",
            "hardware.dtypes=[float32]",
            f"tracking.uri={store}",
            f"hydra.sweep.dir={tmp_path / 'sweep'}",
        ]
    )
    assert out.returncode == 0, out.stderr[-2000:]
    assert "2 finished, 2 skipped, 0 failed" in out.stdout
    client, found = runs(store)
    parents = [r for r in found if r.data.tags.get("quantspec.role") == "sweep"]
    assert len(parents) == 1 and parents[0].info.status == "FINISHED"
    children = [r for r in found if r.data.tags.get("mlflow.parentRunId") == parents[0].info.run_id]
    assert len(children) == 4
    assert sorted((r.data.tags["hardware"], r.data.tags["precision"], r.data.tags["outcome"]) for r in children) == [
        ("phx", "bf16", "skipped"),
        ("phx", "fp32", "finished"),
        ("stx", "bf16", "skipped"),
        ("stx", "fp32", "finished"),
    ]
    assert parents[0].data.tags["jobs_finished"] == "2"
    # read back as a sweep: the latest by default, or by its directory
    from src.tracking.readback.sweeps import sweep_jobs

    parent_id, jobs = sweep_jobs(store)
    assert parent_id == parents[0].info.run_id and len(jobs) == 4
    assert sweep_jobs(store, sweep_id=str((tmp_path / "sweep").resolve()))[0] == parent_id
    finished = [j for j in jobs if j.tags["outcome"] == "finished"]
    assert all(j.metrics["time_per_token_ms_median"] > 0 for j in finished)
    # what the MLflow UI shows on opening: runs (not the GenAI overview), the experiment's how-to, and on
    # the parent the comparison table, the headline metrics and the report (made when the sweep ended)
    exp = client.get_experiment_by_name("quantspec")
    assert exp.tags["mlflow.experimentKind"] == "custom_model_development"
    assert "latest sweep, side by side" in exp.tags["mlflow.note.content"]
    parent = client.get_run(parent_id)
    note = parent.data.tags["mlflow.note.content"]
    assert "time/token (ms)" in note and all(j.name in note for j in jobs)
    assert parent.data.metrics["best/time_per_token_ms_median"] == min(
        j.metrics["time_per_token_ms_median"] for j in finished
    )
    assert parent.data.tags["best_time_per_token_job"] in {j.name for j in finished}
    assert {"report/report.md", "report/summary.csv"} <= {a.path for a in client.list_artifacts(parent_id, "report")}


def test_sweep_survives_a_failing_job_and_exits_nonzero(store, tmp_path):
    good = tmp_path / "corpus.txt"
    good.write_text("def f(x):\n    return x * 2\n" * 50)
    out = run_cli(
        [
            "-m",
            *TINY,
            "task=benchmark",
            "task.prompt_lengths=[8]",
            "dataset=textfile",
            "report_at_end=false",
            f"dataset.path={tmp_path / 'missing.txt'},{good}",
            f"hydra.sweep.dir={tmp_path / 'sweep'}",
        ],
        env={"MLFLOW_TRACKING_URI": store},  # no tracking.uri: the store MLflow's own variable names
    )
    assert out.returncode == 1
    assert "1 finished, 0 skipped, 1 failed" in out.stdout
    _, found = runs(store, "tags.`quantspec.role` = 'job'")
    assert sorted(r.data.tags["outcome"] for r in found) == ["failed", "finished"]
    client, (parent,) = runs(store, "tags.`quantspec.role` = 'sweep'")
    assert not client.list_artifacts(parent.info.run_id)  # report_at_end=false: no report
    # the read-back commands find the sweep in the store MLflow's variable names, as src.run did
    reported = run_cli(
        ["attach=false", f"out={tmp_path / 'reports'}"], module="src.report", env={"MLFLOW_TRACKING_URI": store}
    )
    assert reported.returncode == 0 and parent.info.run_name in reported.stdout, reported.stderr[-2000:]
    judged = run_cli([f"against={tmp_path / 'sweep'}"], module="src.regress", env={"MLFLOW_TRACKING_URI": store})
    assert judged.returncode == 2 and "are the same sweep" in judged.stderr, judged.stderr[-2000:]  # found both


def test_unknown_model_exits_with_one_line():
    out = run_cli(["model=llama-3-400b"])
    assert out.returncode == 2
    assert out.stderr.strip().count("\n") == 0 and "unknown model 'llama-3-400b'" in out.stderr
    assert out.stderr.startswith("quantspec: ")


def test_nan_metrics_are_not_logged(store):
    run = JobRun(Store(store, "quantspec"), None, store, "quantspec")
    run.start("x", None, {}, {}, "key")
    run.log_metrics({"a": 1.0, "b": math.nan})
    run.finish()
    _, (found,) = runs(store)
    assert found.data.metrics == {"a": 1.0}


def test_a_stop_a_library_wrapped_in_its_own_error_is_raised_as_the_stop():
    """OmegaConf and Hydra catch what is raised inside them and raise an error of their own: a job stopped there
    is killed by the stop, not failed by that error; an error with no stop behind it stays the error."""

    def wrapped():
        raise RuntimeError("composition failed")

    saved = signals._pending
    try:
        signals._pending = None
        with pytest.raises(RuntimeError):
            _unwrapped(wrapped)
        signals._pending = 15
        with pytest.raises(signals.Stopped, match="SIGTERM"):
            _unwrapped(wrapped)
    finally:
        signals._pending = saved
