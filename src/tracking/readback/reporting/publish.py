"""The report attached to its sweep in MLflow: files on the parent run, each job's headline figures and
description on the run that stands for it, and the sweep's view (src.tracking.view.ui).
"""

from __future__ import annotations

import math
from pathlib import Path

from mlflow.tracking import MlflowClient

from src.tracking.readback.compare import JobRounds, Speedup, condition, ratio
from src.tracking.readback.reporting.markdown import build
from src.tracking.readback.reporting.rows import Report, _sig3, fallback
from src.tracking.readback.reporting.tables import busy_figure, describe
from src.tracking.store.names import (
    SWEEP_KEY,
)
from src.tracking.view import ui


def publish(
    uri: str, experiment: str, sweep: str | None, baseline: dict[str, str], out_root: Path, quality: dict | None = None
) -> Report:
    """build(), then put it where the MLflow UI shows it: the files under the parent run's `report/`,
    the comparison tables as the parent's description, each job's figures (over its rounds) on the run
    that stands for it in the sweep's view, and the sweep's headline metrics on the parent (so the
    top-level chart view compares sweeps; the runs keep every per-round and per-example metric)."""
    report = build(uri, experiment, sweep, baseline, out_root, quality)
    client = MlflowClient(uri)
    for path in report.files.values():
        client.log_artifact(report.parent_run_id, str(path), "report")
    gains = {u.job.key: u for u in report.speedups}
    on_point = {p.quality_key: p for p in report.points}
    for config in report.configs:
        _publish_job(
            client, config, gains.get(config.key), baseline, report.flags.get(config.key, ""), on_point.get(config.key)
        )
    shown = {c.shown.run_id for c in report.configs}
    for job in report.jobs:  # an earlier attempt that stood for its job no longer does
        if job.tags.get(ui.SHOWN) == "true" and job.run_id not in shown:
            client.set_tag(job.run_id, ui.SHOWN, "false")
    parent = client.get_run(report.parent_run_id)
    held, key = parent.data.metrics, parent.data.tags.get(SWEEP_KEY, report.parent_run_id)
    shown_runs = [client.get_run(c.shown.run_id) for c in report.configs]
    report.view_url = ui.publish_view(client, parent.info.experiment_id, report.parent_run_id, key, shown_runs)
    # relative: the link holds on whatever host and port serve the UI
    client.set_tag(
        report.parent_run_id,
        "mlflow.note.content",
        f"[The sweep's jobs side by side]({ui.page_path(parent.info.experiment_id, key)}) "
        f"([as a share link]({ui.view_path(parent.info.experiment_id, key)}), on a server without "
        f"`--app-name quantspec`, until reloaded)\n\n{report.overview}",
    )
    _headlines(client, report, held)
    if report.points:
        client.set_tag(report.parent_run_id, "front", ", ".join(p.name for p in report.points if p.on_front))
    if report.flags:
        client.set_tag(
            report.parent_run_id,
            "below_quality",
            ", ".join(f"{c.name} ({report.flags[c.key]})" for c in report.configs if c.key in report.flags),
        )
    return report


def _headlines(client: MlflowClient, report: Report, held: dict[str, float]) -> None:
    """The sweep's headline figures on its parent: its fastest job and its best real speedup (no fallback
    on either side; measured quiet where one was), with its rounds and the condition it was taken in."""
    timed = [(c, c.spread("time_per_token_ms_median")) for c in report.configs if not fallback(c.shown)]
    timed = [(c, t) for c, t in timed if not math.isnan(t.median)]
    if timed:
        best, time = min(timed, key=lambda ct: ct[1].median)
        _set_metric(
            client,
            report.parent_run_id,
            "best/time_per_token_ms_median",
            time.median,
            held.get("best/time_per_token_ms_median"),
        )
        client.set_tag(report.parent_run_id, "best_time_per_token_job", best.name)
    real = [
        u
        for u in report.speedups
        if not u.is_baseline
        and not math.isnan(u.time.median)
        and not fallback(u.job.shown)
        and not fallback(u.base.shown)
    ]
    if real:
        # the best of the speedups measured quiet, where there is one: a busy baseline inflates a ratio
        quiet = [u for u in real if not u.time.all_busy]
        top = max(quiet or real, key=lambda u: u.time.median)
        figures = [("best/decode_speedup", top.time.median)]
        if top.time.used > 1:  # one round has no range: no low and high that would only repeat it
            figures += [("best/decode_speedup_low", top.time.low), ("best/decode_speedup_high", top.time.high)]
        for name, value in figures:
            _set_metric(client, report.parent_run_id, name, value, held.get(name))
        client.set_tag(report.parent_run_id, "best_speedup_job", top.job.name)
        client.set_tag(report.parent_run_id, "best_speedup_rounds", f"{top.time.used}{top.time.caveat()}")
        client.set_tag(
            report.parent_run_id,
            "best_speedup_condition",
            condition(top.time, top.busy_sides()) or f"{top.time.used} quiet rounds",
        )


def _publish_job(
    client: MlflowClient, config: JobRounds, gain: Speedup | None, baseline: dict[str, str], flag: str = "", point=None
) -> None:
    """The job's figures over its rounds, on the run that stands for it in the view (ui.VIEW_METRICS,
    3 significant digits: the UI shows a metric unrounded), with each round's as a series, and a
    description that says what ran and how sure the speedup is."""
    run = config.shown
    held = client.get_run(run.run_id).data.metrics
    figures = {ui.over_rounds(name): config.spread(name) for name in ui.OVER_ROUNDS}
    if gain is not None and not gain.is_baseline:
        figures[ui.over_rounds(ui.SPEEDUP)] = gain.time
    for name, figure in figures.items():
        if not math.isnan(figure.median):
            _set_metric(client, run.run_id, name, _sig3(figure.median), held.get(name))
    # 1: the headline figure stands on busy timings only (the job's or its baseline's): a column that sorts
    # before the figures in the view (MLflow orders metric columns by name)
    _set_metric(client, run.run_id, "busy", float(busy_figure(config, gain)), held.get("busy"))
    if flag:  # its configuration fell below quality.min_ratio of its reference (src.tracking.readback.speed_quality)
        _set_metric(client, run.run_id, "quality_below", 1.0, held.get("quality_below"))
    if point is not None and not math.isnan(point.speed.median):
        # the front's point on the run of its quality job, so the view's scatter draws it (src.tracking.view.ui)
        for name, value in (
            ("front/time_per_token_ms_median", _sig3(point.speed.median)),
            ("front/quality", point.quality),
            ("front/on", float(point.on_front)),
        ):
            _set_metric(client, run.run_id, name, value, held.get(name))
    # a range only where there is one: one round's low and high would only repeat its median
    if gain is not None and not gain.is_baseline and gain.time.used > 1:
        for end, value in (("_low", gain.time.low), ("_high", gain.time.high)):
            name = ui.over_rounds(ui.SPEEDUP + end)
            _set_metric(client, run.run_id, name, _sig3(value), held.get(name))
    finished = config.finished()
    figure = "time_per_token_ms_median"
    per_round = {ui.each_round(figure): {r: j.metrics.get(figure) for r, j in finished.items()}}
    if gain is not None and not gain.is_baseline:
        theirs = gain.base.finished()
        per_round[ui.each_round(ui.SPEEDUP)] = {
            r: ratio(theirs[r].metrics.get("time_per_token_ms_median"), j.metrics.get("time_per_token_ms_median"))
            for r, j in finished.items()
            if r in theirs
        }
    if len(config.runs) > 1:
        for name, values in per_round.items():
            _set_series(client, run.run_id, name, values)
    tags = {ui.SHOWN: "true", "mlflow.note.content": describe(config, gain, baseline, flag)}
    if len(config.runs) > 1:
        tags["busy_rounds"] = f"{len(config.busy_rounds())} of {len(finished)}"
    for k, v in tags.items():
        if run.tags.get(k) != v:
            client.set_tag(run.run_id, k, v)


def _set_series(client: MlflowClient, run_id: str, key: str, values: dict[int, float | None]) -> None:
    """Log a step series, each step once: rerunning the report adds no points."""
    held = {m.step for m in client.get_metric_history(run_id, key)}
    for step, value in sorted(values.items()):
        if step not in held and value is not None and not math.isnan(value):
            client.log_metric(run_id, key, value, step=step)


def _set_metric(client: MlflowClient, run_id: str, key: str, value: float, current: float | None) -> None:
    """Log a metric unless the run holds that value already: rerunning the report adds no points."""
    if current is None or not math.isclose(current, value, rel_tol=1e-9, abs_tol=0.0):
        client.log_metric(run_id, key, value)


def ui_line(uri: str, view: str) -> str:
    """Where to look: the server's own address, or for a SQLite store the view's path on whatever address
    `mlflow ui` serves it (it chooses its host and port: nothing here assumes one)."""
    if uri.startswith(("http://", "https://")):
        return view
    return (
        f"/{view} on the address `mlflow ui --app-name quantspec --backend-store-uri {uri}` serves "
        f"(http://127.0.0.1:5000 unless told)"
    )
