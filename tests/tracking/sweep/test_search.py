"""hydra/sweeper=search (src.tracking.sweep.search): Optuna's trials as ordinary jobs of one sweep, timed in
interleaved rounds, the objectives read back from the store, the front reported and tagged; its settings
and an empty search space refused in one line."""

import pytest
from hydra.core.override_parser.overrides_parser import OverridesParser
from mlflow.tracking import MlflowClient

from src.tracking.sweep import search
from tests.support.cli import fresh_cache, run_cli

pytest.importorskip("optuna", reason="optuna not installed (scripts/setup installs it: the search extra)")


def test_a_search_runs_its_trials_as_jobs_in_rounds_and_reports_the_front(tmp_path):
    store = f"sqlite:///{tmp_path / 'mlflow.db'}"
    out = run_cli(
        [
            "-m",
            "hydra/sweeper=search",
            "model=tiny-llama",
            "precision=fp32,w8a8",
            "draft=none,prompt_lookup",
            "task.limit=2",
            "task.max_new_tokens=8",
            "rounds=2",
            "hydra.sweeper.trials=4",
            "hydra.sweeper.batch=2",
            f"tracking.uri={store}",
            f"hydra.sweep.dir={tmp_path / 'sweep'}",
            "report_at_end=false",
        ],
        env={"QUANTSPEC_CACHE": str(fresh_cache(tmp_path / "cache"))},
    )
    assert out.returncode == 0, out.stderr[-3000:]
    assert "search done" in out.stdout and "on the front" in out.stdout
    table = (tmp_path / "sweep" / "search.md").read_text()
    assert table.count("★") >= 1 and "median ± MAD over rounds" in table
    client = MlflowClient(store)
    exp = client.get_experiment_by_name("quantspec")
    (parent,) = client.search_runs([exp.experiment_id], "tags.`quantspec.role` = 'sweep'")
    jobs = client.search_runs([exp.experiment_id], "tags.`quantspec.role` = 'job'")
    assert parent.data.tags["search_front"].startswith("trial ")
    assert all(j.data.tags["mlflow.parentRunId"] == parent.info.run_id for j in jobs)
    measured = {j.data.tags["search_trial"] for j in jobs}
    # each configuration measured once per round (a repeated proposal is not run again), in both rounds
    by_config = {}
    for j in jobs:
        by_config.setdefault((j.data.tags["precision"], j.data.tags["draft"]), []).append(j)
    assert all(len(runs) % 2 == 0 for runs in by_config.values()) and len(measured) == len(by_config)
    assert all(j.data.tags["on_search_front"] in ("true", "false") for j in jobs)
    assert all("time_per_token_ms_median" in j.data.metrics and "divergent_share" in j.data.metrics for j in jobs)


@pytest.mark.parametrize(
    "args, said",
    [
        (["precision=fp32"], "has nothing to search"),
        (["precision=fp32,bf16", "hydra.sweeper.objectives=[speed:fastest]"], "is not metric:minimize"),
        (["precision=fp32,bf16", "hydra.sweeper.sampler=grid"], "hydra.sweeper.sampler=grid is not one of"),
        (["precision=w8a8", "precision.alpha=interval(0.9,0.3)"], "an interval runs from a lower to a higher"),
        # a metric no job logs: the first batch's finished jobs say so, and the search ends there
        (
            [
                "precision=fp32,bf16",
                "task.limit=1",
                "task.max_new_tokens=2",
                "hydra.sweeper.objectives=[speed:minimize]",
            ],
            "names speed, which the trial's finished jobs do not log (they log ",
        ),
    ],
)
def test_a_search_that_cannot_run_says_why_in_one_line(tmp_path, args, said):
    out = run_cli(
        [
            "-m",
            "hydra/sweeper=search",
            "model=tiny-llama",
            *args,
            f"tracking.uri=sqlite:///{tmp_path / 'db'}",
            f"hydra.sweep.dir={tmp_path / 'sweep'}",
        ]
    )
    assert out.returncode == 2 and said in out.stderr, out.stderr[-2000:]
    assert "Traceback" not in out.stderr and len([x for x in out.stderr.splitlines() if "quantspec:" in x]) == 1


def test_a_search_whose_every_trial_is_refused_ends_in_lines_not_a_traceback(tmp_path):
    """precision.alpha=interval(2,5) lies outside the field's range: each trial is refused by its config, and the
    sweeper's tell had then read a parent run that did not exist (AttributeError)."""
    out = run_cli(
        [
            "-m",
            "hydra/sweeper=search",
            "model=tiny-llama",
            "precision=w8a8",
            "precision.alpha=interval(2,5)",
            "hydra.sweeper.trials=2",
            f"tracking.uri=sqlite:///{tmp_path / 'db'}",
            f"hydra.sweep.dir={tmp_path / 'sweep'}",
        ]
    )
    assert out.returncode == 1 and "Traceback" not in out.stderr + out.stdout, out.stderr[-2000:]
    assert "AttributeError" not in out.stderr + out.stdout and "all 2 jobs refused by their config" in out.stdout
    assert out.stdout.count("refused by its config (said above)") >= 2  # each trial's log line and its table row


def test_the_space_reads_the_command_line():
    parser = OverridesParser.create()
    plan = search.space(
        parser.parse_overrides(
            [
                "precision=fp32,w8a8",
                "draft.k=range(2,5)",
                "task=decode,perplexity",
                "precision.alpha=interval(0.3,0.9)",
                "model=tiny-llama",
                "rounds=2",
            ]
        )
    )
    axes = {a.key: a for a in plan.axes}
    assert axes["precision"].values == ["fp32", "w8a8"] and axes["draft.k"].values == ["2", "3", "4"]
    assert (axes["precision.alpha"].low, axes["precision.alpha"].high) == (0.3, 0.9)
    assert plan.tasks == ["decode", "perplexity"] and plan.fixed == ["model=tiny-llama", "rounds=2"]


def test_the_front_keeps_what_nothing_beats():
    t = [search.Trial(i, {}, [], values=v) for i, v in enumerate([[1, 5], [2, 2], [3, 3], [5, 1]])]
    assert [x.number for x in search._pareto(t, ["minimize", "minimize"])] == [0, 1, 3]
    assert [x.number for x in search._pareto(t, ["minimize", "maximize"])] == [0]
