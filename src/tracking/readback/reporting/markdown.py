"""The report built: its tables, plots and report.md from a sweep's runs (`build`)."""

from __future__ import annotations

from pathlib import Path

from mlflow.tracking import MlflowClient

from src.common.mdtext import md_code, md_text
from src.common.metrics import csv_text, markdown_table, seed_table
from src.common.paths import child
from src.tracking.readback import batched, serving
from src.tracking.readback import speed_quality as q
from src.tracking.readback.compare import job_rounds, speedups
from src.tracking.readback.reporting import jsondoc
from src.tracking.readback.reporting.plots import _plots, _save
from src.tracking.readback.reporting.rows import Report, draft_quality_lines, fallback_lines, job_rows
from src.tracking.readback.reporting.settings import DEFAULT_BASELINE, DEFAULT_QUALITY
from src.tracking.readback.reporting.tables import rounds_lines, speedup_table, summary_rows
from src.tracking.readback.sweeps import sweep_jobs
from src.tracking.store.names import (
    SWEEP_KEY,
)


def _check_baseline(baseline: dict[str, str], jobs) -> None:
    """A baseline choice the user set that no job of the sweep has is a typo (baseline.precision=zzz): refused in
    one line, not written as a report with no speedups. The defaults may match nothing (a sweep without fp32)."""
    for group, choice in baseline.items():
        held = sorted({j.choice(group) for j in jobs})
        if choice != DEFAULT_BASELINE.get(group) and choice not in held:
            raise LookupError(
                f"baseline.{group}={choice} is no job's {group} in this sweep (its jobs': {', '.join(held)}); "
                f"name one of those"
            )


def build(
    uri: str, experiment: str, sweep: str | None, baseline: dict[str, str], out_root: Path, quality: dict | None = None
) -> Report:
    """quality: the report's quality settings (metric, min_ratio: report/settings.py); None: their defaults."""
    quality = {**DEFAULT_QUALITY, **(quality or {})}
    parent_id, jobs = sweep_jobs(uri, experiment, sweep)
    client = MlflowClient(uri)
    groups = job_rounds(jobs)
    _check_baseline(baseline, jobs)
    finished = [j for j in jobs if j.tags.get("outcome") == "finished"]
    rows_of = {j.name: job_rows(client, j) for j in finished}
    tables = {name: seed_table(rows) for name, rows in rows_of.items() if rows}
    gains = speedups(groups, baseline)
    parent = client.get_run(parent_id)
    # a run name is anyone's string, and two sweep directories may share a base name: the sweep's key too
    out = child(out_root, f"{parent.info.run_name.replace(' ', '_')}-{parent.data.tags.get(SWEEP_KEY, parent_id)[:8]}")
    out.mkdir(parents=True, exist_ok=True)
    base_text = ", ".join(f"{k}={v}" for k, v in baseline.items())
    reference = baseline.get("precision", "fp32")
    ratios = q.quality_ratios(groups, reference)
    flags = q.flags(groups, ratios, quality["min_ratio"])
    files = _plots(client, finished, rows_of, gains, out, base_text, flags)
    metric, points = q.front_of(groups, quality["metric"], flags)
    plot = q.front_plot(points, metric, out / "front.png", _save)
    if plot is not None:
        files[plot.name] = plot
    summary, headers = summary_rows(groups, flags)
    rounds = max((len(c.runs) for c in groups), default=1)
    parts = [
        f"# {md_text(parent.info.run_name)}\n",
        f"{md_code(parent.data.tags.get('overrides', ''))}\n",
        *fallback_lines(jobs),
        *rounds_lines(groups, rounds),
        "## Summary\n",
        markdown_table(headers, summary) + "\n",
        f"## Speedup over the baseline ({base_text}; same model, hardware, task and engine)\n",
        (speedup_table(gains, flags) if gains else "(no job has its baseline in this sweep)") + "\n",
    ]
    parts += _quality_parts(client, groups, ratios, quality, reference, (metric, points), out, files)
    served = serving.levels(groups)
    if served:
        parts += [
            "## Serving: throughput against latency (each load level, the median over its rounds)\n",
            serving.table(served) + "\n",
        ]
        drawn = serving.plot(served, out / "serving.png", _save)
        if drawn is not None:
            files[drawn.name] = drawn
    batches = batched.sizes(groups)
    if batches:
        parts += [
            "## Batched decoding, offline (each batch size B: prompt and generated tokens a second, the median over "
            "its rounds)\n",
            batched.table(batches) + "\n",
        ]
    drafted = draft_quality_lines(jobs)
    if drafted:
        parts += ["## pass@1 with and without the draft\n", "\n".join(drafted) + "\n"]
    overview = "\n".join(parts[2:])
    parts += [f"![{name}]({name})\n" for name in files if name.endswith(".png")]
    for name, table in tables.items():
        parts += [f"## {md_text(name)}\n", table + "\n"]
    (out / "report.md").write_text("\n".join(parts))
    (out / "summary.csv").write_text(csv_text([headers, *summary]))
    files.update(
        {"report.md": out / "report.md", "summary.csv": out / "summary.csv", "report.json": out / "report.json"}
    )
    made = Report(parent_id, jobs, groups, tables, summary, gains, files, overview, flags=flags, points=points)
    (out / "report.json").write_text(jsondoc.text(made, baseline))
    return made


def _quality_parts(client, groups, ratios, quality: dict, reference: str, front, out: Path, files: dict) -> list[str]:
    """The report's quality sections: against the reference, the speed–quality front (and front.csv, added
    to `files`) and the paired comparisons; none where the sweep measured no quality."""
    parts = []
    table = q.quality_table(groups, ratios, quality["min_ratio"], reference)
    if table:
        parts += [
            f"## Quality against the reference (a job below {quality['min_ratio']} of its reference's "
            f"quality is marked ⚠ wherever its speed is shown)\n",
            table + "\n",
        ]
    metric, points = front
    if points:
        instead = "" if metric == quality["metric"] else f", as no job measured quality.metric={quality['metric']}"
        parts += [
            f"## Speed–quality front ({metric}{instead}; ★ on the front: no other configuration is at "
            f"least as fast and as good)\n",
            q.front_table(points, metric) + "\n",
        ]
        header = ["configuration", "time_per_token_ms", "low", "high", "timed_by", metric, "se", "on_front", "flag"]
        (out / "front.csv").write_text(csv_text([header, *[_front_row(p) for p in points]]))
        files["front.csv"] = out / "front.csv"
    pairs = q.paired_table(client, groups)
    if pairs:
        parts += ["## Paired comparisons (the same tokens or items scored by both jobs)\n", pairs + "\n"]
    return parts


def _front_row(p) -> list:
    return [
        p.name,
        p.speed.median,
        p.speed.low,
        p.speed.high,
        p.speed_source,
        p.quality,
        p.quality_se,
        int(p.on_front),
        p.flag,
    ]
