"""Where a sweep is compared in the MLflow UI, and the address that opens it.

MLflow's runs list nests a sweep's jobs under a collapsed parent row and shows no metric column until
the user picks some. Each sweep therefore gets a view, stored the way MLflow's own "share view" button
stores one (an experiment tag `mlflow.sharedViewState.<key>` holding the view as JSON): the sweep's
jobs, flat, fastest first, with the columns that compare them. `view_url` is the address that opens
it; the latest sweep's view is also kept under the key `latest`, so one fixed address always shows
the newest sweep.
"""

from __future__ import annotations

import json
from urllib.parse import quote

VIEW_TAG = "mlflow.sharedViewState."
LATEST = "latest"
SQLITE_UI = "http://127.0.0.1:5000"   # where `mlflow ui` serves a SQLite store by default
# The columns that compare jobs, each only where a job of the sweep logged it. The UI lists metric
# columns alphabetically and a laptop screen holds about six beside the dataset: the rest (efficiency,
# peak memory, others' CPU) are a click away under Columns.
METRIC_COLUMNS = ("time_per_token_ms_median", "speedup_vs_baseline", "prefill_ms_median", "tokens_per_s_median",
                  "perplexity", "pass_at_1", "acceptance_rate_overall", "speedup_vs_no_draft_median")
TAG_COLUMNS = ("host_busy", "sandbox")
ATTRIBUTE_COLUMNS = ("Dataset",)


def experiment_tags(experiment_id: str) -> dict[str, str]:
    """The experiment opens on its runs (model development, not MLflow's GenAI overview), with a
    description that says how to compare a sweep and links the latest sweep's view."""
    latest = f"#/experiments/{experiment_id}/runs?viewStateShareKey={LATEST}&workflowType=machine_learning"
    return {
        "mlflow.experimentKind": "custom_model_development",
        "mlflow.note.content": (
            f"quantspec sweeps of model x hardware x precision x draft x task. **[The latest sweep, side by side]"
            f"({latest})**: its jobs, fastest first, with time/token, speedup over the baseline, prefill, tokens/s, "
            "quality and dataset. Every sweep ends by printing the address of its own view, and its parent run "
            "(named `sweep <date> <time>`) links it too; the parent's description holds the sweep's comparison "
            "table and its `report/` artifacts the full report with plots. Each job is a child run named by its "
            "axes (model·hardware·precision·draft·task); more columns (decode_efficiency_median, peak_rss_gb, "
            "others_cpu_cores) are under Columns, charts under the chart view, CPU and memory per job under "
            "each run's System metrics.")}


def view_state(parent_run_id: str, metrics: set[str], tags: set[str]) -> dict:
    """The view of one sweep: its jobs only (a filter, which also lists them flat rather than nested
    under the parent), ordered by time/token, with the comparison columns the jobs have."""
    columns = [f"attributes.`{name}`" for name in ATTRIBUTE_COLUMNS]
    columns += [f"metrics.`{name}`" for name in METRIC_COLUMNS if name in metrics]
    columns += [f"tags.`{name}`" for name in TAG_COLUMNS if name in tags]
    ordered = "time_per_token_ms_median" in metrics
    return {"searchFilter": f"tags.`mlflow.parentRunId` = '{parent_run_id}'",
            "orderByKey": "metrics.`time_per_token_ms_median`" if ordered else "attributes.start_time",
            "orderByAsc": ordered,
            "selectedColumns": columns}


def view_path(experiment_id: str, key: str) -> str:
    """The view's address within whatever serves the MLflow UI (a link in a description is relative:
    it works on any host and port)."""
    # workflowType: open the model-training runs list, not MLflow's GenAI overview
    return f"#/experiments/{experiment_id}/runs?viewStateShareKey={quote(key)}&workflowType=machine_learning"


def view_url(tracking_uri: str, experiment_id: str, key: str) -> str:
    """The page of the view: on the store's own server, or where `mlflow ui` serves a SQLite store by
    default (it may serve it elsewhere: view_path is the part that holds everywhere)."""
    base = tracking_uri.rstrip("/") if tracking_uri.startswith(("http://", "https://")) else SQLITE_UI
    return f"{base}/{view_path(experiment_id, key)}"


def publish_view(client, experiment_id: str, parent_run_id: str, sweep_key: str, jobs: list) -> str:
    """Store the sweep's view under its key and as the latest; returns the address of the sweep's view."""
    metrics = {name for job in jobs for name in job.metrics}
    tags = {name for job in jobs for name in job.tags}
    state = json.dumps(view_state(parent_run_id, metrics, tags))
    for key in (sweep_key, LATEST):
        client.set_experiment_tag(experiment_id, VIEW_TAG + key, state)
    return view_url(client.tracking_uri, experiment_id, sweep_key)
