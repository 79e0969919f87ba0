"""Read a sweep's job runs back from the tracking store, as flat records for tables and ratios."""

from __future__ import annotations

from dataclasses import dataclass, field

from mlflow.tracking import MlflowClient

from src.common import renames
from src.tracking.store.names import ROLE, SWEEP_KEY, key_of, latest_attempts


@dataclass
class JobRecord:
    run_id: str
    name: str
    tags: dict[str, str]
    metrics: dict[str, float]
    params: dict[str, str] = field(default_factory=dict)

    def choice(self, group: str) -> str:
        return self.tags.get(group, "?")

    @classmethod
    def of(cls, run) -> JobRecord:
        """An MLflow run as a record, its params under today's names (a run recorded before a rename reads as
        one recorded after it: src.common.renames)."""
        data = run.data
        return cls(
            run.info.run_id, run.info.run_name, dict(data.tags), dict(data.metrics), renames.current(data.params)
        )


def find_sweep(client: MlflowClient, experiment: str, sweep_id: str | None = None):
    """The sweep's parent run: the one named by its sweep id (its directory), else the latest."""
    exp = client.get_experiment_by_name(experiment)
    if exp is None:
        raise LookupError(f"no experiment {experiment!r} in {client.tracking_uri}; run a sweep first")
    query = f"tags.`{ROLE}` = 'sweep'" + (f" and tags.`{SWEEP_KEY}` = '{key_of(sweep_id)}'" if sweep_id else "")
    runs = client.search_runs(
        [exp.experiment_id], filter_string=query, order_by=["attributes.start_time DESC"], max_results=1
    )
    if not runs:
        raise LookupError(f"no sweep {sweep_id or ''} in experiment {experiment!r}".replace("  ", " "))
    return exp.experiment_id, runs[0]


def sweep_jobs(uri: str, experiment: str = "quantspec", sweep_id: str | None = None) -> tuple[str, list[JobRecord]]:
    """(parent run id, its job runs in start order: the latest attempt of each job)."""
    client = MlflowClient(uri)
    experiment_id, parent = find_sweep(client, experiment, sweep_id)
    runs = latest_attempts(
        client.search_runs(
            [experiment_id], max_results=5000, filter_string=f"tags.mlflow.parentRunId = '{parent.info.run_id}'"
        )
    )
    return parent.info.run_id, [JobRecord.of(r) for r in runs]
