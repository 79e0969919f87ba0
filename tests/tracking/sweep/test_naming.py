"""A job is named by its choices and the fields its sweep varies: the same name in the store, the view, the
report, regress and a search (src.tracking.sweep.naming)."""

from __future__ import annotations

from pathlib import Path

from mlflow.tracking import MlflowClient

from src.tracking.sweep.naming import field_of, job_name, told, varying
from tests.support.cli import fresh_cache, run_cli

CHOICES = {"model": "m", "hardware": "cpu", "precision": "w4a16", "draft": "none", "task": "decode", "engine": "native"}


def test_a_field_the_sweep_varies_is_named_and_one_every_job_shares_is_not():
    jobs = [
        ["precision=w4a16", "precision.head_format=w8a16", "task.limit=2"],
        ["precision=w4a16", "precision.head_format=w4a16", "task.limit=2"],
    ]
    assert varying(jobs) == ["precision.head_format"]
    assert varying([["a.b=1"], []]) == ["a.b"]  # set in one job, left at its default in the other
    assert field_of("precision@draft.precision=bf16") is None and field_of("+x.y=1") is None
    assert field_of("hydra.job.chdir=true") is None and field_of("precision=w8a8") is None
    said = told(jobs[0], varying(jobs))
    assert said[:3] == jobs[0] and said[3] == "++hydra.job.env_set.QUANTSPEC_VARIES='precision.head_format'"
    assert told(jobs[0], []) == jobs[0]
    assert job_name(CHOICES, jobs[0], "precision.head_format") == "m·cpu·w4a16·none·decode·head_format=w8a16"
    assert job_name(CHOICES, jobs[0], "") == "m·cpu·w4a16·none·decode"
    # two varying keys with one last segment are named in full
    both = ["task.limit=1", "draft.limit=3"]
    assert job_name(CHOICES, both, "task.limit draft.limit").endswith("·task.limit=1·draft.limit=3")
    assert job_name({**CHOICES, "engine": "openvino"}, [], "") == "m·cpu·w4a16·none·decode·openvino"


def _sweep(tmp_path, store: str, name: str):
    out = run_cli(
        [
            "-m",
            "model=tiny-llama",
            "precision=w4a16",
            "precision.head_format=w8a16,w4a16",
            "task.limit=1",
            "task.max_new_tokens=2",
            f"tracking.uri={store}",
            f"hydra.sweep.dir={tmp_path / name}",
        ],
        env={"QUANTSPEC_CACHE": str(fresh_cache(tmp_path / "cache"))},
    )
    assert out.returncode == 0, out.stderr[-3000:]
    return out


def test_two_jobs_that_differ_in_a_field_have_two_names_everywhere(tmp_path):
    store = f"sqlite:///{tmp_path / 'mlflow.db'}"
    names = {f"tiny-llama·cpu·w4a16·none·decode·head_format={s}" for s in ("w8a16", "w4a16")}
    _sweep(tmp_path, store, "a")
    client = MlflowClient(store)
    exp = client.get_experiment_by_name("quantspec")
    jobs = client.search_runs([exp.experiment_id], "tags.`quantspec.role` = 'job'")
    assert {j.info.run_name for j in jobs} == names
    # the view: each job's description (its Description column) says its field; the report: each its row
    described = [client.get_run(j.info.run_id).data.tags.get("mlflow.note.content", "") for j in jobs]
    assert sorted(d.split(" · ")[-3] for d in described) == ["w4a16 head_format=w4a16", "w4a16 head_format=w8a16"]
    (parent,) = client.search_runs([exp.experiment_id], "tags.`quantspec.role` = 'sweep'")
    text = Path(client.download_artifacts(parent.info.run_id, "report/report.md", str(tmp_path))).read_text()
    assert all(n in text for n in names), text[:2000]
    # regress: the same two jobs in a second sweep, each judged under its own name
    _sweep(tmp_path, store, "b")
    judged = run_cli(
        [f"against={tmp_path / 'a'}", f"sweep={tmp_path / 'b'}", f"tracking.uri={store}"], module="src.regress"
    )
    assert judged.returncode == 0, judged.stderr[-2000:]
    assert all(n in judged.stdout for n in names), judged.stdout[-3000:]


def test_search_trials_over_a_field_are_named_by_its_value(tmp_path):
    store = f"sqlite:///{tmp_path / 'mlflow.db'}"
    out = run_cli(
        [
            "-m",
            "hydra/sweeper=search",
            "model=tiny-llama",
            "precision=w8a8",
            "precision.alpha=interval(0.3,0.9)",
            "task.limit=1",
            "task.max_new_tokens=2",
            "hydra.sweeper.trials=2",
            "hydra.sweeper.batch=2",
            "hydra.sweeper.objectives=[time_per_token_ms_median:minimize]",
            f"tracking.uri={store}",
            f"hydra.sweep.dir={tmp_path / 'search'}",
            "report_at_end=false",
        ],
        env={"QUANTSPEC_CACHE": str(fresh_cache(tmp_path / "cache"))},
    )
    assert out.returncode == 0, out.stderr[-3000:]
    client = MlflowClient(store)
    exp = client.get_experiment_by_name("quantspec")
    jobs = client.search_runs([exp.experiment_id], "tags.`quantspec.role` = 'job'")
    names = [j.info.run_name for j in jobs]
    assert len(set(names)) == len(jobs) == 2, names
    assert all(n.startswith("tiny-llama·cpu·w8a8·none·decode·alpha=") for n in names), names
