"""The MLflow run lifecycle: one parent run per sweep, one child run per job, and how a job ends.

Through MlflowClient rather than the fluent API: a sweep runs many jobs in one process, and explicit
run ids keep one job's logging from leaking into the next. What this adds over MLflow itself: the
sweep parent is found or created by its sweep id (so any launcher works), a job ends as finished,
skipped or failed with its reason, and nothing already logged is lost when a job fails.
"""

from __future__ import annotations

import math
import time
import traceback
from dataclasses import dataclass
from pathlib import Path

from mlflow.entities import Metric, Param, RunStatus, RunTag
from mlflow.exceptions import MlflowException
from mlflow.tracking import MlflowClient

from src.environment import PROJECT_ROOT

# Tag and metric names are a contract users query by (issue 2): fixed.
ROLE, SWEEP_ID = "quantspec.role", "quantspec.sweep_id"
OUTCOME, REASON = "outcome", "outcome_reason"
MAX_PARAM_CHARS = 6000      # MLflow's limit on a param value
BATCH = 100                 # MLflow's limit on params (and tags) per log_batch call


def default_uri() -> str:
    return f"sqlite:///{PROJECT_ROOT / 'mlflow.db'}"


def artifact_location(uri: str) -> str | None:
    """SQLite stores keep artifacts beside the database: never in whatever directory a job runs from."""
    if uri.startswith("sqlite:///"):
        return (Path(uri.removeprefix("sqlite:///")).parent / "mlartifacts").resolve().as_uri()
    return None  # a server decides where its artifacts go


def flatten(tree: dict, prefix: str = "") -> dict[str, str]:
    """Nested config to dot keys, the way the MLflow UI compares params."""
    flat: dict[str, str] = {}
    for key, value in tree.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict):
            flat.update(flatten(value, f"{name}."))
        else:
            flat[name] = str(value)[:MAX_PARAM_CHARS]
    return flat


@dataclass
class SweepInfo:
    sweep_id: str        # the sweep directory: unique per sweep, and the same for all its jobs
    name: str
    overrides: str


class Tracker:
    def __init__(self, uri: str, experiment: str):
        self.uri = uri
        self.client = MlflowClient(tracking_uri=uri)
        self.experiment_id = self._experiment(experiment)

    def _experiment(self, name: str) -> str:
        found = self.client.get_experiment_by_name(name)
        if found is not None:
            return found.experiment_id
        try:
            return self.client.create_experiment(name, artifact_location=artifact_location(self.uri))
        except MlflowException:  # another process created it between our look and our create
            return self.client.get_experiment_by_name(name).experiment_id

    def _find_sweep(self, sweep_id: str):
        runs = self.client.search_runs([self.experiment_id], max_results=1,
                                       filter_string=f"tags.`{SWEEP_ID}` = '{sweep_id}' and tags.`{ROLE}` = 'sweep'")
        return runs[0] if runs else None

    def sweep_parent(self, sweep: SweepInfo) -> str:
        found = self._find_sweep(sweep.sweep_id)
        if found is not None:
            return found.info.run_id
        run = self.client.create_run(self.experiment_id, run_name=sweep.name,
                                     tags={ROLE: "sweep", SWEEP_ID: sweep.sweep_id, "overrides": sweep.overrides})
        return run.info.run_id

    def close_sweep(self, sweep_id: str, outcomes: list[str]) -> None:
        found = self._find_sweep(sweep_id)
        if found is None:
            return
        run_id = found.info.run_id
        for outcome in ("finished", "skipped", "failed"):
            self.client.set_tag(run_id, f"jobs_{outcome}", str(outcomes.count(outcome)))
        self.client.set_terminated(run_id, RunStatus.to_string(RunStatus.FINISHED))

    def start_job(self, name: str, parent_id: str | None, params: dict[str, str], tags: dict[str, str]) -> "JobRun":
        all_tags = {ROLE: "job", **tags}
        if parent_id:
            all_tags["mlflow.parentRunId"] = parent_id
        run = self.client.create_run(self.experiment_id, run_name=name, tags=all_tags)
        job = JobRun(self.client, run.info.run_id)
        job.log_params(params)
        return job


class JobRun:
    def __init__(self, client: MlflowClient, run_id: str):
        self.client = client
        self.run_id = run_id
        self.outcome: str | None = None   # finished, skipped or failed once the run has ended

    def log_params(self, params: dict[str, str]) -> None:
        items = [Param(k, v) for k, v in params.items()]
        for i in range(0, len(items), BATCH):
            self.client.log_batch(self.run_id, params=items[i:i + BATCH])

    def set_tags(self, tags: dict[str, str]) -> None:
        items = [RunTag(k, str(v)) for k, v in tags.items()]
        for i in range(0, len(items), BATCH):
            self.client.log_batch(self.run_id, tags=items[i:i + BATCH])

    def log_metrics(self, values: dict[str, float], step: int = 0) -> None:
        now = int(time.time() * 1000)
        metrics = [Metric(k, float(v), now, step) for k, v in values.items() if not math.isnan(float(v))]
        for i in range(0, len(metrics), 1000):
            self.client.log_batch(self.run_id, metrics=metrics[i:i + 1000])

    def log_text(self, text: str, name: str) -> None:
        self.client.log_text(self.run_id, text, name)

    def _end(self, outcome: str, status: RunStatus, reason: str | None = None) -> None:
        self.outcome = outcome
        self.set_tags({OUTCOME: outcome, **({REASON: reason[:5000]} if reason else {})})
        self.client.set_terminated(self.run_id, RunStatus.to_string(status))

    def finish(self) -> None:
        self._end("finished", RunStatus.FINISHED)

    def skip(self, reason: str) -> None:
        # KILLED, not FINISHED: a skipped job has no results, and status filters in the UI should show that.
        self._end("skipped", RunStatus.KILLED, reason)

    def fail(self, err: BaseException) -> None:
        try:
            self.log_text("".join(traceback.format_exception(err)), "error.txt")
        finally:
            self._end("failed", RunStatus.FAILED, f"{type(err).__name__}: {err}")
