"""Where a sweep is compared in the MLflow UI, and the address that opens it.

MLflow's runs list nests a sweep's jobs under a collapsed parent row and shows no metric column until
the user picks some. Each sweep therefore gets a view, stored the way MLflow's own "share view" button
stores one (an experiment tag `mlflow.sharedViewState.<key>` holding the view as JSON): one row per job
(the run that stands for it over its rounds), fastest first, with the columns that tell the jobs apart
and preset charts. The latest sweep's view is also kept under the key `latest`, so one fixed address
always shows the newest sweep.

Two addresses open a view. `page_path` is quantspec's page (`mlflow ui --app-name quantspec`,
src.tracking.view.view_app), which makes the view the browser's own state, so that it survives a reload;
`view_path` is MLflow's share link, which any MLflow server opens, but only until the page is reloaded
(MLflow 3.17 passes over a share key once its address holds search facets, which it writes there itself).
"""

from __future__ import annotations

import json
from urllib.parse import quote

VIEW_TAG = "mlflow.sharedViewState."
LATEST = "latest"
SHOWN = "quantspec.shown"  # 'true' on the one run that stands for a job (its rounds) in the view
# What MLflow's runs table cannot be told (its source, experimentPage.column-utils.tsx): it lays out
# attribute columns first (Run Name, Created and Duration always; Description, Dataset where selected),
# then metrics, then params, then tags, each group in alphabetical order, and columns cannot be moved.
# So what a job is (its figure's condition first, then precision, draft, hardware as it ran) is its run's
# description (an attribute column, before the metrics; the UI shows its first ~50 characters), and the
# figures over a job's rounds are its rounds' figures under their own names (a job's figure has one name
# everywhere), behind `rounds/` (`round/` for the series of each round's value): `busy` (1 where the figure stands
# on busy timings only) sorts before them.
OVER_ROUNDS = (  # the job's own figures, published over its rounds by the report (src.tracking.readback.reporting)
    "time_per_token_ms_median",
    "prefill_ms_median",
    "tokens_per_s_median",
    "ttft_ms_p99",
    "itl_ms_p50",
    "itl_ms_p90",
    "itl_ms_p99",
    "peak_rss_gb",
)
ROUNDS, ROUND = "rounds/", "round/"  # a figure over the job's rounds; the series of each round's value
SPEEDUP = "decode_speedup"  # the median of a job's per-round speedups over its baseline (it has no round figure)


def over_rounds(figure: str) -> str:
    """The name a job's figure has over its rounds, on the run that stands for it."""
    return ROUNDS + figure


def each_round(figure: str) -> str:
    """The name of the series of a job's figure, a point a round."""
    return ROUND + figure


VIEW_METRICS = (
    "busy",
    "quality_below",
    over_rounds("time_per_token_ms_median"),
    over_rounds(SPEEDUP),
    over_rounds(SPEEDUP + "_low"),
    over_rounds(SPEEDUP + "_high"),
    *(over_rounds(f) for f in OVER_ROUNDS[1:]),
    "perplexity",
    "kl_mean",
    "top1_agreement",
    "delta_perplexity",
    "accuracy",
    "front/on",
    "pass_at_1",
    "acceptance_rate_overall",
    "speedup_vs_no_draft_median",
)
TAG_COLUMNS = ("host_busy", "busy_rounds", "sandbox")
# A job timed too briefly to tell carries no host_busy tag: it was not flagged, which is what "false" says
TAG_UNSET = {"host_busy": "false"}
SORT = over_rounds("time_per_token_ms_median")
FRONT = (
    "front/time_per_token_ms_median",
    "front/quality",
)  # a quality job's point: its configuration's speed, its quality
CHARTS = (
    (SORT, "BAR"),
    (over_rounds(SPEEDUP), "BAR"),
    (SORT, "SCATTER"),
    (over_rounds(SPEEDUP), "SCATTER"),
)


def experiment_tags(experiment_id: str) -> dict[str, str]:
    """The experiment opens on its runs (model development, not MLflow's GenAI overview), with a
    description that says how to compare a sweep and links the latest sweep's view."""
    return {
        "mlflow.experimentKind": "custom_model_development",
        "mlflow.note.content": (
            f"quantspec sweeps of model x hardware x precision x draft x task. **[The latest sweep, side by side]"
            f"({page_path(experiment_id, LATEST)})** ([as a share link]({view_path(experiment_id, LATEST)}), on a "
            "server without `--app-name quantspec`, until reloaded): one row per job, fastest first, with what ran, time/token, speedup over the baseline "
            "with its range over rounds, prefill, tokens/s and quality. Every sweep ends by printing the address "
            "of its own view, and its parent run "
            "(named `sweep <date> <time>`) links it too; the parent's description holds the sweep's comparison "
            "table and its `report/` artifacts the full report with plots. Each job is a child run named by its "
            "axes (model·hardware·precision·draft·task); more columns (decode_efficiency_median, peak_rss_gb, "
            "others_cpu_cores) are under Columns, charts under the chart view, CPU and memory per job under "
            "each run's System metrics."
        ),
    }


def view_state(parent_run_id: str, runs: list) -> dict:
    """The view of one sweep: the run that stands for each of its jobs (a filter, which also lists them
    flat rather than nested under the parent), fastest first, with the columns that tell them apart
    (one identical on every row says nothing), and charts of time per token and speedup: one bar per
    job, and the same by precision."""
    busy = sorted(r.info.run_name for r in runs if r.data.metrics.get("busy"))
    ordered = any(SORT in r.data.metrics for r in runs)
    return {
        "searchFilter": f"tags.`mlflow.parentRunId` = '{parent_run_id}' and tags.`{SHOWN}` = 'true'",
        "orderByKey": f"metrics.`{SORT}`" if ordered else "attributes.start_time",
        "orderByAsc": ordered,
        "selectedColumns": _columns(runs, busy),
        "compareRunCharts": _charts(runs, busy),
        "compareRunSections": [
            {
                "uuid": SECTION,
                "name": "time per token and speedup",
                "display": True,
                "isReordered": False,
                "deleted": False,
                "isExpanded": True,
            }
        ],
        # MLflow sorts chart sections by name unless told they were reordered: ours first, the rest after
        "isAccordionReordered": True,
    }


SECTION = "quantspec"  # the view's own section of charts


def _columns(runs: list, busy: list[str]) -> list[str]:
    """The columns that tell the jobs apart: one identical on every row says nothing."""

    def differs(values: list) -> bool:
        return len(runs) < 2 or len({str(v) for v in values}) > 1

    columns = ["attributes.`Description`"] if differs([r.data.tags.get("mlflow.note.content") for r in runs]) else []
    columns += [
        f"metrics.`{name}`"
        for name in VIEW_METRICS
        if any(name in r.data.metrics for r in runs)
        and (name == SORT or (name == "busy" and busy) or differs([r.data.metrics.get(name) for r in runs]))
    ]
    columns += [
        f"tags.`{name}`"
        for name in TAG_COLUMNS
        if any(name in r.data.tags for r in runs)
        and differs([r.data.tags.get(name, TAG_UNSET.get(name)) for r in runs])
    ]
    return columns


def _chart(uuid: str, kind: str, **fields) -> dict:
    return {
        "uuid": uuid,
        "type": kind,
        "metricSectionId": SECTION,
        "deleted": False,
        "isGenerated": False,
        "runsCountToCompare": 100,
        **fields,
    }


def _charts(runs: list, busy: list[str]) -> list[dict]:
    """A bar chart per figure and the same by precision; the speed–quality front where quality was measured."""
    # a chart's bars carry no mark of their own: its title names the jobs whose figure was timed busy
    flag = f" (⚠ BUSY: {', '.join(busy)})" if busy else ""
    charts = [
        _chart(
            f"quantspec-{kind.lower()}-{metric}",
            kind,
            **(
                {"metricKey": metric, "displayName": metric + flag}
                if kind == "BAR"
                else {
                    "xaxis": {"key": "choice.precision", "type": "PARAM"},
                    "yaxis": {"key": metric, "type": "METRIC"},
                    "displayName": f"{metric} by precision{flag}",
                }
            ),
        )
        for metric, kind in CHARTS
        if any(metric in r.data.metrics for r in runs)
    ]
    if any(FRONT[1] in r.data.metrics for r in runs):  # the speed–quality front (src.tracking.readback.speed_quality)
        charts.append(
            _chart(
                "quantspec-front",
                "SCATTER",
                xaxis={"key": FRONT[0], "type": "METRIC"},
                yaxis={"key": FRONT[1], "type": "METRIC"},
                displayName="speed–quality front: the quality figure against decode ms/token "
                "(front/on = 1: on the front; quality_below = 1: below the reference's)",
            )
        )
    return charts


def view_path(experiment_id: str, key: str) -> str:
    """The view's address within whatever serves the MLflow UI (a link in a description is relative:
    it works on any host and port)."""
    # workflowType: open the model-training runs list, not MLflow's GenAI overview
    return f"#/experiments/{experiment_id}/runs?viewStateShareKey={quote(key)}&workflowType=machine_learning"


def page_path(experiment_id: str, key: str) -> str:
    """quantspec's page that opens the view and keeps it through reloads (served by `mlflow ui --app-name
    quantspec`: src.tracking.view.view_app)."""
    return f"quantspec/view/{experiment_id}/{quote(key)}"


def view_url(tracking_uri: str, experiment_id: str, key: str) -> str:
    """The page of the view: on the store's own server; for a SQLite store, the path within whatever
    serves it (`mlflow ui` picks its own host and port)."""
    if tracking_uri.startswith(("http://", "https://")):
        return f"{tracking_uri.rstrip('/')}/{page_path(experiment_id, key)}"
    return page_path(experiment_id, key)


def publish_view(client, experiment_id: str, parent_run_id: str, sweep_key: str, runs: list) -> str:
    """Store the sweep's view under its key and as the latest; returns the address of the sweep's view
    (view_url).
    `runs`: the MLflow runs that stand for the sweep's jobs."""
    state = json.dumps(view_state(parent_run_id, runs))
    for key in (sweep_key, LATEST):
        client.set_experiment_tag(experiment_id, VIEW_TAG + key, state)
    return view_url(client.tracking_uri, experiment_id, sweep_key)
