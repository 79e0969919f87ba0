"""Records as the store and the docs hold them: a job's round built by hand, metrics no catalog entry names, a schema
the docs show, and a recorder that keeps what a job built in process reports."""

from __future__ import annotations

import json

from src.assembly import schema  # noqa: F401 - the groups' schemas, which every composition is typed by
from tests.support.cli import ROOT


def job_record(
    key: str,
    rnd: int,
    time_per_token_ms: float,
    busy: bool = False,
    outcome: str = "finished",
    precision: str = "w8a8",
    **tags,
):
    """One round of a job as the report reads it back from the store (src.tracking.readback.sweeps.JobRecord), built
    by hand: its identity across rounds, round, busy flag, outcome and choices, its time per token."""
    from src.tracking.readback.sweeps import JobRecord

    tags = {
        "quantspec.config_key": key,
        "round": str(rnd),
        "host_busy": str(busy).lower(),
        "outcome": outcome,
        "precision": precision,
        "model": "m",
        "hardware": "cpu",
        "draft": "none",
        "task": "decode",
        "engine": "native",
        **tags,
    }
    return JobRecord(f"{key}-{rnd}", key, tags, {"time_per_token_ms_median": time_per_token_ms})


def uncatalogued(store_uri: str, experiment: str = "quantspec") -> dict[str, list[str]]:
    """The metric, param and tag names the store's runs carry that src.tracking.store.catalog does not list (and so
    the docs' reference page lacks)."""
    from mlflow.tracking import MlflowClient

    from src.tracking.store import catalog

    client = MlflowClient(store_uri)
    runs = client.search_runs([client.get_experiment_by_name(experiment).experiment_id])
    seen = {"metric": set(), "param": set(), "tag": set()}
    for run in runs:
        seen["metric"] |= set(run.data.metrics)
        seen["param"] |= set(run.data.params)
        seen["tag"] |= set(run.data.tags)
    return {kind: missing for kind, names in seen.items() if (missing := catalog.unlisted(kind, names))}


def doc_schema(name: str) -> dict:
    """The JSON schema docs/reference/report-json.md shows under `<!-- schema: name -->`: the code's documents are
    validated against what the reader is told."""
    text = (ROOT / "docs" / "reference" / "report-json.md").read_text()
    block = text.split(f"<!-- schema: {name} -->", 1)[1].split("```json", 1)[1].split("```", 1)[0]
    return json.loads(block)


class Kept:
    """A recorder that keeps what building reports."""

    def __init__(self):
        self.tags, self.metrics, self.texts, self.params, self.inputs = {}, {}, {}, {}, {}

    def set_tags(self, tags):
        self.tags.update(tags)

    def log_metrics(self, values, step=0):
        self.metrics.update(values)

    def log_text(self, text, name):
        self.texts[name] = text

    def log_params(self, params):
        self.params.update(params)

    def log_input(self, text, context):
        self.inputs[text.name] = context
