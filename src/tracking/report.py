"""Compare a sweep: the seed table of each job, a summary, speedups over a baseline, plots, and where the
sweep measured quality, the quality table, the speed–quality front and paired comparisons
(src.tracking.quality).

    python -m src.tracking.report                          # the latest sweep in the default store
    python -m src.tracking.report sweep=/abs/multirun/... baseline.precision=bf16 tracking_uri=http://127.0.0.1:5000
    python -m src.tracking.report quality.metric=accuracy quality.min_ratio=0.98
    python -m src.tracking.report --help                   # this, and the settings; touches nothing

Reads the runs back from the tracking store (the report's numbers are the runs' own metrics), writes
report.md, summary.csv and PNG plots, and attaches them to the sweep's parent run so the MLflow UI
shows them beside the runs; rerun, it replaces the files and adds no metric points. Settings:
conf/report.yaml, overridable as key=value; a key it does not have is refused in one line.
"""

from __future__ import annotations

import math
import sys
import textwrap
from dataclasses import dataclass, field
from pathlib import Path

from matplotlib.figure import Figure  # no pyplot: figures are written to files, never shown
from mlflow.tracking import MlflowClient
from omegaconf import OmegaConf

from src.assembly.config import AXES
from src.common import envvars
from src.common.environment import PROJECT_ROOT
from src.common.metrics import EXAMPLE, LEGACY_EXAMPLE, ROW_METRICS, Row, csv_text, markdown_table, seed_table
from src.common.paths import child
from src.tracking import (
    CONFIG_KEY,
    SWEEP_KEY,
    StoreUnreachable,
    bound_http_retries,
    default_uri,
    first_line,
    probe,
    ui,
)
from src.tracking import quality as q
from src.tracking.compare import Config, Speedup, Spread, condition, configs, ratio, speedups
from src.tracking.sweeps import JobRecord, sweep_jobs

SUMMARY = (
    ("time_per_token_ms_median", "time/token (ms)"),
    ("prefill_ms_median", "prefill (ms)"),
    ("tokens_per_s_median", "tokens/s"),
    ("perplexity", "perplexity"),
    ("kl_mean", "KL mean"),
    ("accuracy", "accuracy"),
    ("pass_at_1", "pass@1"),
    ("decode_efficiency_median", "decode efficiency"),
    ("acceptance_rate_overall", "acceptance"),
    ("speedup_vs_no_draft_median", "speedup vs no draft (measured)"),
    ("expected_speedup", "expected speedup (Leviathan)"),
)


@dataclass
class Report:
    parent_run_id: str
    jobs: list[JobRecord]  # every run: each round of each job
    configs: list[Config]  # the jobs across their rounds
    tables: dict[str, str]  # run name -> its seed table
    summary: list[list]  # one row per job
    speedups: list[Speedup]  # one per job with a baseline
    files: dict[str, Path]
    overview: str = ""  # the summary and speedup tables (the parent run's description)
    view_url: str = ""  # where the MLflow UI shows the sweep's jobs side by side (publish)
    flags: dict[str, str] = field(default_factory=dict)  # config key -> below quality.min_ratio, said
    points: list = field(default_factory=list)  # the speed–quality points (src.tracking.quality)


def job_rows(client: MlflowClient, job: JobRecord) -> list[Row]:
    """Per-example rows rebuilt from the run's metric histories (step = example number)."""
    prefix = (
        EXAMPLE
        if EXAMPLE + "prompt_tokens" in job.metrics or LEGACY_EXAMPLE + "prompt_tokens" not in job.metrics
        else LEGACY_EXAMPLE
    )  # a sweep recorded before the series were renamed
    history = {m: {p.step: p.value for p in client.get_metric_history(job.run_id, prefix + m)} for m in ROW_METRICS}
    steps = sorted(history["prompt_tokens"])
    get = lambda m, s: history[m].get(s, math.nan)  # noqa: E731 - NaN: never logged (one-token example)
    return [
        Row(
            s,
            int(get("prompt_tokens", s)),
            int(get("new_tokens", s)),
            get("total_time_s", s),
            get("prefill_ms", s),
            get("time_per_token_ms", s),
            get("tokens_per_s", s),
        )
        for s in steps
    ]


def kernels_of(job: JobRecord) -> str:
    """The kernels that ran: quantspec's variant, ATen's as asked, or ATen's in place of quantspec's."""
    kind, isa = job.tags.get("kernels", "?"), job.tags.get("kernels_isa")
    if kind == "quantspec" and isa:
        return f"quantspec/{isa}"
    return "ATen (FALLBACK)" if kind == "fallback" else kind


def fallback(job: JobRecord) -> bool:
    return job.tags.get("kernels") == "fallback"


def fallback_lines(jobs: list[JobRecord]) -> list[str]:
    """Said above the tables: a fallback job's times are ATen's, not its precision's."""
    fell = [j for j in jobs if fallback(j)]
    if not fell:
        return []
    return [
        f"**Kernels fell back**: {', '.join(j.name for j in fell)} ran on ATen's kernels because quantspec's "
        f"could not run here ({fell[0].tags.get('kernels_note', '?')}). Their times are ATen's, not their "
        f"precisions'; rows marked FALLBACK, and no headline metric uses them.\n"
    ]


def draft_quality_lines(jobs: list[JobRecord]) -> list[str]:
    """For each job that coded with a draft: its pass@1 against the same completions made without it."""
    lines = []
    for job in jobs:
        m = job.metrics
        if "pass_at_1_no_draft" not in m or "pass_at_1" not in m:
            continue
        same = m.get("completions_identical_to_no_draft", math.nan)
        verdict = "equal" if m["pass_at_1"] == m["pass_at_1_no_draft"] else "different"
        lines.append(
            f"- {job.name}: pass@1 {m['pass_at_1']:.3f} with the draft, {m['pass_at_1_no_draft']:.3f} "
            f"without ({verdict}; {same:.0%} of the completions identical)"
        )
    return lines


def _by_job(
    jobs: list[JobRecord],
    rows_of: dict[str, list[Row]],
    metric: str,
    label: str,
    out: Path,
    flagged: dict[str, str] | None = None,
):
    """Tasks whose prompts have no fixed lengths (decode, benchmark_code): each job's median over its
    examples, whiskers from its fastest to its slowest example. None where no such job has rows."""
    drawn = [
        (j.name, [getattr(r, metric) for r in rows_of.get(j.name) or []])
        for j in jobs
        if j.choice("task") not in ("benchmark", "benchmark_long")
    ]
    drawn = [(name, [v for v in values if not math.isnan(v)]) for name, values in drawn]
    drawn = [(name, sorted(values)) for name, values in drawn if values]
    if not drawn:
        return None
    busy = {j.name for j in jobs if j.tags.get("host_busy") == "true"}
    fig = Figure(figsize=(7, 0.45 * len(drawn) + 1.5))
    ax = fig.subplots()
    medians = [v[len(v) // 2] for _, v in drawn]
    low = [m - v[0] for m, (_, v) in zip(medians, drawn)]
    high = [v[-1] - m for m, (_, v) in zip(medians, drawn)]
    flagged = flagged or {}
    said = [", ".join(s for s in ("⚠ BUSY" if name in busy else "", flagged.get(name, "")) if s) for name, _ in drawn]
    bars = ax.barh(
        [_marked(name, s) for (name, _), s in zip(drawn, said)], medians, xerr=[low, high], color="tab:blue", capsize=3
    )
    _hatch_busy(bars, [name in busy for name, _ in drawn])
    ax.set_xlabel(f"{label}: median over the examples, whiskers from the fastest to the slowest")
    ax.set_title(f"{label} by job" + (" (hatched: timed while other processes used the CPU)" if busy else ""))
    ax.grid(True, axis="x", alpha=0.3)
    path = out / f"{metric}_by_job.png"
    _save(fig, path)
    return path


def _hatch_busy(bars, busy: list[bool]) -> None:
    """A busy figure's bar is drawn hatched and pale: seen before its value is read."""
    for bar, was_busy in zip(bars, busy):
        if was_busy:
            bar.set_hatch("///")
            bar.set_alpha(0.45)
            bar.set_edgecolor("tab:red")


def _save(fig, path: Path) -> None:
    """The figure saved with everything it draws inside the image: titles wrapped to its width, the
    layout tightened, and the canvas widened or heightened by whatever still overflows it (a long job
    name, a label past the bars)."""
    for ax in fig.axes:
        title = ax.get_title()
        if title:
            ax.set_title(textwrap.fill(title, width=int(fig.get_figwidth() * 11)), fontsize=9)
        label = ax.get_xlabel()
        if label:
            ax.set_xlabel(textwrap.fill(label, width=int(fig.get_figwidth() * 13)), fontsize=8)
    for _ in range(4):
        fig.tight_layout()
        box = fig.get_tightbbox()  # inches
        width, height = fig.get_size_inches()
        over_x = max(0.0, -box.x0) + max(0.0, box.x1 - width)
        over_y = max(0.0, -box.y0) + max(0.0, box.y1 - height)
        if over_x < 0.01 and over_y < 0.01:
            break
        fig.set_size_inches(width + over_x + 0.1, height + over_y + 0.1)
    fig.savefig(path, dpi=110)


def _plots(
    client: MlflowClient,
    jobs: list[JobRecord],
    rows_of: dict[str, list[Row]],
    speedups: list[Speedup],
    out: Path,
    base_text: str = "the baseline",
    flags: dict[str, str] | None = None,
) -> dict[str, Path]:
    """flags: config key -> its quality flag (src.tracking.quality.flags), said on its bars too."""
    flags = flags or {}
    flagged = {
        j.name: flags[j.tags.get(CONFIG_KEY, j.run_id)] for j in jobs if j.tags.get(CONFIG_KEY, j.run_id) in flags
    }

    files = {}
    for metric, label in (("time_per_token_ms", "time/token (ms)"), ("prefill_ms", "prefill (ms)")):
        fig = Figure(figsize=(7, 4.5))
        ax = fig.subplots()
        drawn = 0
        for job in jobs:
            rows = rows_of.get(job.name) or []
            if len(rows) < 2 or job.choice("task") not in ("benchmark", "benchmark_long"):
                continue  # only fixed-length prompts make a curve against prompt length
            busy = job.tags.get("host_busy") == "true"
            ax.plot(
                [r.prompt_tokens for r in rows],
                [getattr(r, metric) for r in rows],
                marker="o",
                linestyle="--" if busy else "-",
                label=("⚠ BUSY " if busy else "") + f"{job.choice('precision')} · {job.choice('draft')} · "
                f"{job.choice('hardware')}",
            )
            drawn += 1
        if drawn:
            ax.set_xscale("log", base=2)
            ax.set_xlabel("prompt length (tokens)")
            ax.set_ylabel(label)
            ax.set_title(f"{label} against prompt length")
            ax.grid(True, alpha=0.3)
            ax.legend(fontsize=8)
            path = out / f"{metric}_vs_prompt.png"
            _save(fig, path)
            files[path.name] = path
        path = _by_job(jobs, rows_of, metric, label, out, flagged)
        if path is not None:
            files[path.name] = path
    drawn = [u for u in speedups if not u.is_baseline and not math.isnan(u.time.median)]
    if drawn:
        fig = Figure(figsize=(7, 0.45 * len(drawn) + 1.5))
        ax = fig.subplots()
        medians = [u.time.median for u in drawn]
        said = [", ".join(s for s in (marker(u.job, u), flags.get(u.job.key, "")) if s) for u in drawn]
        bars = ax.barh(
            [_marked(u.job.name, m) for u, m in zip(drawn, said)],
            medians,
            color="tab:blue",
            capsize=3,
            xerr=[[u.time.median - u.time.low for u in drawn], [u.time.high - u.time.median for u in drawn]],
        )
        busy = [busy_figure(u.job, u) for u in drawn]
        _hatch_busy(bars, busy)
        ax.axvline(1.0, color="black", linewidth=0.8)
        rounds = max(u.time.used for u in drawn)
        ax.set_xlabel(
            f"time/token speedup over {base_text}"
            + (f": median of the per-round ratios, whiskers their min–max ({rounds} rounds)" if rounds > 1 else "")
        )
        ax.set_title(
            "speedup over the baseline: the job that differs only in "
            + ", ".join(sorted({k.split("=")[0] for k in base_text.split(", ")}))
            + " (same model, hardware, task, engine)"
            + ("; hatched: timed busy" if any(busy) else "")
        )
        for y, u in enumerate(drawn):
            ax.text(u.time.high, y, f" {u.time.text('×')}", va="center", fontsize=7)
        # room right of the longest bar for its label: the axis, not the canvas, holds it
        ax.set_xlim(0, max(u.time.high for u in drawn) * 1.45)
        path = out / "speedup.png"
        _save(fig, path)
        files[path.name] = path
    return files


def save_markdown(name: str, text: str) -> Path:
    """A benchmark script's result, as reports/<name>.md under the project root (reports/ is not tracked)."""
    out = PROJECT_ROOT / "reports" / f"{name}.md"
    out.parent.mkdir(exist_ok=True)
    out.write_text(text)
    print(f"\nwritten to {out.relative_to(PROJECT_ROOT)}")
    return out


def _drop_empty(rows: list[list], headers: list[str], fixed: int = 4) -> tuple[list[list], list[str]]:
    """The summary without the metric columns no job has (all NaN: perplexity in a timing sweep)."""
    keep = [
        i
        for i, h in enumerate(headers)
        if i < fixed or any(not (isinstance(r[i], float) and math.isnan(r[i])) for r in rows)
    ]
    return [[r[i] for i in keep] for r in rows], [headers[i] for i in keep]


def summary_rows(groups: list[Config], flags: dict[str, str] | None = None) -> tuple[list[list], list[str]]:
    """One row per job: what ran, and each metric as the median over its rounds (time/token with its
    min–max where there were several)."""
    several = any(len(c.runs) > 1 for c in groups)
    rows = []
    for c in groups:
        time = c.spread("time_per_token_ms_median")
        values = [_sig3(c.spread(k).median) for k, _ in SUMMARY]
        if several:  # the rounds, and time/token's range beside its median
            values = [
                f"{len(c.finished())}" + (f" ({len(c.busy_rounds())} busy)" if c.busy_rounds() else ""),
                values[0],
                f"{time.low:.3g}–{time.high:.3g}" if time.used > 1 else math.nan,
                *values[1:],
            ]
        said = ", ".join(
            s for s in (marker(c, None) if busy_figure(c, None) else "", (flags or {}).get(c.key, "")) if s
        )
        rows.append([_marked(c.name, said), c.outcome, c.shown.tags.get("ran_on", "?"), kernels_of(c.shown), *values])
    names = [h for _, h in SUMMARY]
    headers = [
        "job",
        "outcome",
        "ran on",
        "kernels",
        *(["rounds", names[0], "time/token min–max (ms)", *names[1:]] if several else names),
    ]
    return _drop_empty(rows, headers, fixed=4 + several)


def _marked(name: str, said: str) -> str:
    """A job's name with its figure's condition before it, where there is one to say."""
    return f"[{said}] {name}" if said else name


def speedup_table(gains: list[Speedup], flags: dict[str, str] | None = None) -> str:
    flags = flags or {}
    rows = [
        [
            _marked(u.job.name, ", ".join(s for s in (marker(u.job, u), flags.get(u.job.key, "")) if s))
            + (" (FALLBACK)" if fallback(u.job.shown) else ""),
            u.base.name + (" (FALLBACK)" if fallback(u.base.shown) else ""),
            *(
                ["(the baseline)", "-", "-", "-"]
                if u.is_baseline
                else [
                    _sig3(u.time.median),
                    f"{u.time.low:.3g}–{u.time.high:.3g}" if u.time.used > 1 else "-",
                    u.time.used,
                    u.time.caveat().strip(" []") or "-",
                ]
            ),
            _sig3(u.prefill.median),
        ]
        for u in gains
        # a task that times nothing (perplexity, lm_eval) has no speedup: its quality is in the quality table
        if not math.isnan(u.job.spread("time_per_token_ms_median").median)
    ]
    rows, headers = _drop_empty(
        rows, ["job", "baseline", "time/token speedup", "range (min–max)", "rounds", "busy", "prefill speedup"], fixed=6
    )
    return markdown_table(headers, rows)


def build(
    uri: str, experiment: str, sweep: str | None, baseline: dict[str, str], out_root: Path, quality: dict | None = None
) -> Report:
    """quality: the report's quality settings (conf/report.yaml: metric, min_ratio); None: their defaults."""
    quality = {**OmegaConf.to_container(OmegaConf.load(SETTINGS).quality), **(quality or {})}
    parent_id, jobs = sweep_jobs(uri, experiment, sweep)
    client = MlflowClient(uri)
    groups = configs(jobs)
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
        f"# {parent.info.run_name}\n",
        f"`{parent.data.tags.get('overrides', '')}`\n",
        *fallback_lines(jobs),
        *rounds_lines(groups, rounds),
        "## Summary\n",
        markdown_table(headers, summary) + "\n",
        f"## Speedup over the baseline ({base_text}; same model, hardware, task and engine)\n",
        (speedup_table(gains, flags) if gains else "(no job has its baseline in this sweep)") + "\n",
    ]
    table = q.quality_table(groups, ratios, quality["min_ratio"], reference)
    if table:
        parts += [
            f"## Quality against the reference (a job below {quality['min_ratio']} of its reference's "
            f"quality is marked ⚠ wherever its speed is shown)\n",
            table + "\n",
        ]
    if points:
        instead = "" if metric == quality["metric"] else f", as no job measured quality.metric={quality['metric']}"
        parts += [
            f"## Speed–quality front ({metric}{instead}; ★ on the front: no other configuration is at "
            f"least as fast and as good)\n",
            q.front_table(points, metric) + "\n",
        ]
        (out / "front.csv").write_text(
            csv_text(
                [
                    ["configuration", "time_per_token_ms", "low", "high", "timed_by", metric, "se", "on_front", "flag"],
                    *[
                        [
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
                        for p in points
                    ],
                ]
            )
        )
        files["front.csv"] = out / "front.csv"
    pairs = q.paired_table(client, groups)
    if pairs:
        parts += ["## Paired comparisons (the same tokens or items scored by both jobs)\n", pairs + "\n"]
    drafted = draft_quality_lines(jobs)
    if drafted:
        parts += ["## pass@1 with and without the draft\n", "\n".join(drafted) + "\n"]
    overview = "\n".join(parts[2:])
    parts += [f"![{name}]({name})\n" for name in files if name.endswith(".png")]
    for name, table in tables.items():
        parts += [f"## {name}\n", table + "\n"]
    (out / "report.md").write_text("\n".join(parts))
    (out / "summary.csv").write_text(csv_text([headers, *summary]))
    files.update({"report.md": out / "report.md", "summary.csv": out / "summary.csv"})
    return Report(parent_id, jobs, groups, tables, summary, gains, files, overview, flags=flags, points=points)


def rounds_lines(groups: list[Config], rounds: int) -> list[str]:
    """How the figures were taken: rounds, and the busy rounds left out (said where the numbers are)."""
    if rounds <= 1:
        busy = [c.name for c in groups if c.busy_rounds()]
        return (
            [
                f"**Busy host**: {', '.join(busy)} ran while other processes used the CPU (host_busy); "
                f"their times are noisy. More rounds (rounds=3) measure each job again in turns.\n"
            ]
            if busy
            else []
        )
    left = sorted({r for c in groups for r in c.busy_rounds()})
    asked = groups[0].shown.params.get("rounds", str(rounds))
    extra = (
        f" (rounds={asked}, and {rounds - int(asked)} more for busy rounds)"
        if asked.isdigit() and int(asked) < rounds
        else ""
    )
    return [
        f"Measured in {rounds} interleaved rounds{extra} (each job once per round, in a rotated order); each "
        f"figure is the median over the rounds, each speedup the median of the per-round ratios, with "
        f"their min–max. "
        + (
            f"Busy rounds ({', '.join(map(str, left))}: another process used the CPU) "
            f"are left out of every figure that has a quiet round.\n"
            if left
            else "No round was busy.\n"
        )
    ]


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
    timed = [(c, c.spread("time_per_token_ms_median")) for c in report.configs if not fallback(c.shown)]
    timed = [(c, t) for c, t in timed if not math.isnan(t.median)]
    if timed:
        best, time = min(timed, key=lambda ct: ct[1].median)
        _set_metric(
            client, report.parent_run_id, "best_time_per_token_ms", time.median, held.get("best_time_per_token_ms")
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
        figures = [("best_speedup", top.time.median)]
        if top.time.used > 1:  # one round has no range: no low and high that would only repeat it
            figures += [("best_speedup_low", top.time.low), ("best_speedup_high", top.time.high)]
        for name, value in figures:
            _set_metric(client, report.parent_run_id, name, value, held.get(name))
        client.set_tag(report.parent_run_id, "best_speedup_job", top.job.name)
        client.set_tag(report.parent_run_id, "best_speedup_rounds", f"{top.time.used}{top.time.caveat()}")
        client.set_tag(
            report.parent_run_id,
            "best_speedup_condition",
            condition(top.time, top.busy_sides()) or f"{top.time.used} quiet rounds",
        )
    if report.points:
        client.set_tag(report.parent_run_id, "front", ", ".join(p.name for p in report.points if p.on_front))
    if report.flags:
        client.set_tag(
            report.parent_run_id,
            "below_quality",
            ", ".join(f"{c.name} ({report.flags[c.key]})" for c in report.configs if c.key in report.flags),
        )
    return report


def _publish_job(
    client: MlflowClient, config: Config, gain: Speedup | None, baseline: dict[str, str], flag: str = "", point=None
) -> None:
    """The job's figures over its rounds, on the run that stands for it in the view (ui.VIEW_METRICS,
    3 significant digits: the UI shows a metric unrounded), with each round's as a series, and a
    description that says what ran and how sure the speedup is."""
    run = config.shown
    held = client.get_run(run.run_id).data.metrics
    figures = {
        "decode_ms_per_token": config.spread("time_per_token_ms_median"),
        "prefill_ms": config.spread("prefill_ms_median"),
        "tokens_per_s": config.spread("tokens_per_s_median"),
    }
    if gain is not None and not gain.is_baseline:
        figures["decode_speedup"] = gain.time
    for name, figure in figures.items():
        if not math.isnan(figure.median):
            _set_metric(client, run.run_id, name, _sig3(figure.median), held.get(name))
    # 1: the headline figure stands on busy timings only (the job's or its baseline's): a column that sorts
    # before the figures in the view (MLflow orders metric columns by name)
    _set_metric(client, run.run_id, "busy", float(busy_figure(config, gain)), held.get("busy"))
    if flag:  # its configuration fell below quality.min_ratio of its reference (src.tracking.quality)
        _set_metric(client, run.run_id, "quality_below", 1.0, held.get("quality_below"))
    if point is not None and not math.isnan(point.speed.median):
        # the front's point on the run of its quality job, so the view's scatter draws it (src.tracking.ui)
        for name, value in (
            ("front_ms_per_token", _sig3(point.speed.median)),
            ("front_quality", point.quality),
            ("on_front", float(point.on_front)),
        ):
            _set_metric(client, run.run_id, name, value, held.get(name))
    # a range only where there is one: one round's low and high would only repeat its median
    if gain is not None and not gain.is_baseline and gain.time.used > 1:
        _set_metric(client, run.run_id, "decode_speedup_low", _sig3(gain.time.low), held.get("decode_speedup_low"))
        _set_metric(client, run.run_id, "decode_speedup_high", _sig3(gain.time.high), held.get("decode_speedup_high"))
    finished = config.finished()
    per_round = {
        "round/decode_ms_per_token": {r: j.metrics.get("time_per_token_ms_median") for r, j in finished.items()}
    }
    if gain is not None and not gain.is_baseline:
        theirs = gain.base.finished()
        per_round["round/decode_speedup"] = {
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


def _headline(config: Config, gain: Speedup | None) -> tuple[Spread, list[str]]:
    """The job's headline figure: its speedup where it has one (with the sides timed busy: its baseline's
    busy rounds count), else its time per token."""
    if gain is not None and not gain.is_baseline and not math.isnan(gain.time.median):
        return gain.time, gain.busy_sides()
    return config.spread("time_per_token_ms_median"), []


def marker(config: Config, gain: Speedup | None) -> str:
    """How far the job's headline figure can be trusted, in the few characters a table shows first:
    `⚠ BUSY baseline, 1 round`, `1 round`, or '' (several quiet rounds)."""
    figure, sides = _headline(config, gain)
    said = condition(figure, sides)
    return f"⚠ {said}" if figure.all_busy else said


def busy_figure(config: Config, gain: Speedup | None) -> bool:
    """Whether the job's headline figure stands on busy timings only."""
    return _headline(config, gain)[0].all_busy


def describe(config: Config, gain: Speedup | None, baseline: dict[str, str], flag: str = "") -> str:
    """One line for the view's Description column, whose first ~50 characters are all the UI shows: the
    figure's condition first (busy, one round), then the speedup, then what ran (precision, hardware as
    executed, draft)."""
    run = config.shown
    draft = config.choice("draft")
    engine = config.choice("engine")
    said = marker(config, gain)
    if gain is not None and not gain.is_baseline and not math.isnan(gain.time.median):
        figure = f"{gain.time.median:.3g}× over {gain.base.choice('precision')}"
        if gain.time.used > 1:
            figure += f" ({gain.time.low:.3g}–{gain.time.high:.3g}×)"
    elif gain is not None and gain.is_baseline:
        figure = f"the baseline ({', '.join(f'{k}={v}' for k, v in baseline.items())})"
    else:
        figure = ""
    what = (
        f"{config.choice('precision')}{'' if engine in ('native', '?') else ' on ' + engine} · "
        f"{'no draft' if draft == 'none' else 'draft ' + draft} · {run.tags.get('ran_on', config.choice('hardware'))}"
    )
    return " · ".join(part for part in (flag, said, figure, what) if part)


def _sig3(value: float) -> float:
    """Three significant digits: what a timing on a shared host can tell (NaN stays NaN)."""
    return float(f"{value:.3g}")


def _set_series(client: MlflowClient, run_id: str, key: str, values: dict[int, float | None]) -> None:
    """Log a step series, each step once: rerunning the report adds no points."""
    held = {m.step for m in client.get_metric_history(run_id, key)}
    for step, value in sorted(values.items()):
        if step not in held and value is not None and not math.isnan(value):
            client.log_metric(run_id, key, value, step=step)


SETTINGS = PROJECT_ROOT / "conf" / "report.yaml"
BASELINE_KEYS = AXES  # the choices a job is tagged with


class SettingError(ValueError):
    """A report setting that is not one; the message is the one line the user sees."""


def settings(argv: list[str] = ()):
    """conf/report.yaml under key=value overrides; a key it does not have is refused, naming those it has."""
    base = OmegaConf.load(SETTINGS)
    for arg in argv:
        key, eq, _ = arg.partition("=")
        top, _, sub = key.partition(".")
        if not eq or not key:
            raise SettingError(
                f"{arg!r} is not key=value; settings: {', '.join(base)} (python -m src.tracking.report --help)"
            )
        nested = {"baseline": BASELINE_KEYS, "quality": tuple(base.quality)}
        if top not in base or (top in nested and sub not in nested[top]) or (top not in nested and sub):
            raise SettingError(
                f"{key} is not a report setting; settings: {', '.join(base)}, baseline.<"
                f"{'|'.join(BASELINE_KEYS)}> and quality.<{'|'.join(base.quality)}> "
                f"(python -m src.tracking.report --help)"
            )
    merged = OmegaConf.merge(base, OmegaConf.from_dotlist(list(argv)))
    if merged.quality.metric not in q.METRICS:
        raise SettingError(f"quality.metric={merged.quality.metric} is not one of: {', '.join(q.METRICS)}")
    try:
        ratio = float(merged.quality.min_ratio)
    except (TypeError, ValueError):
        ratio = math.nan
    if not 0 < ratio <= 1:  # nan fails here too
        raise SettingError(f"quality.min_ratio={merged.quality.min_ratio} must be above 0 and at most 1")
    if not isinstance(merged.attach, bool):
        raise SettingError(f"attach={merged.attach} must be true or false")
    return merged


def store_problem(uri: str) -> str | None:
    """Why a command that reads a store cannot, in one line, or None: no SQLite store at that path (opening it
    would create an empty one), or a tracking server that does not answer within seconds (MLflow's own client
    would retry for minutes)."""
    if uri.startswith("sqlite:///"):
        path = Path(uri.removeprefix("sqlite:///"))
        if not path.is_file() or path.stat().st_size == 0:
            return f"no tracking store at {uri}; run a sweep first (python -m src.run -m ...)"
        with path.open("rb") as f:
            if f.read(16) != b"SQLite format 3\x00":
                return f"{path} is not a SQLite database, so not a tracking store; point tracking_uri= at one"
        try:  # MLflow checks the schema on open: one behind its own is refused with what to run
            MlflowClient(uri).search_experiments(max_results=1)
        except Exception as err:  # noqa: BLE001 - MLflow's, SQLAlchemy's, SQLite's: one line each
            return f"the tracking store {uri} cannot be read ({first_line(err)[:300]})"
    bound_http_retries()
    try:
        probe(uri)
    except StoreUnreachable as err:
        return f"{str(err).split(';')[0]}; start it, or point tracking_uri= at another store"
    return None


def usage() -> str:
    """This module's docstring and its settings with their defaults and comments (conf/report.yaml)."""
    return f"{__doc__.strip()}\n\nSettings (conf/report.yaml):\n\n" + "\n".join(
        f"    {line}" for line in SETTINGS.read_text().splitlines() if line.strip() and not line.startswith("#")
    )


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


def at_sweep_end(uri: str, experiment: str, sweep_id: str) -> None:
    """A sweep's report, made and attached when it ends (report_at_end), with conf/report.yaml's baseline."""
    cfg = settings()
    try:
        report = publish(uri, experiment, sweep_id, dict(cfg.baseline), PROJECT_ROOT / cfg.out, dict(cfg.quality))
        print(f"quantspec: compare the sweep in the MLflow UI: {ui_line(uri, report.view_url)}", flush=True)
    except Exception as err:  # noqa: BLE001 - the runs are recorded; `python -m src.tracking.report` can redo this
        print(
            f"quantspec: the sweep's report was not made ({type(err).__name__}: {str(err).splitlines()[0][:120]}); "
            f"run python -m src.tracking.report",
            file=sys.stderr,
        )


def main(argv: list[str]) -> int:
    if {"-h", "--help"} & set(argv):
        print(usage())
        return 0
    try:
        envvars.check()
        cfg = settings(argv)
    except (SettingError, envvars.EnvError) as err:
        print(f"quantspec: {err}", file=sys.stderr)
        return 2
    uri = cfg.tracking_uri or default_uri()
    if (line := store_problem(uri)) is not None:
        print(f"quantspec: {line}", file=sys.stderr)
        return 2
    try:
        sweep = str(Path(cfg.sweep).resolve()) if cfg.sweep else None  # sweeps are keyed by absolute directory
        report = (publish if cfg.attach else build)(
            uri, cfg.experiment, sweep, dict(cfg.baseline), PROJECT_ROOT / cfg.out, dict(cfg.quality)
        )
    except LookupError as err:
        print(f"quantspec: {err}", file=sys.stderr)
        return 2
    print((report.files["report.md"]).read_text())
    print(
        f"written to {report.files['report.md'].parent}"
        + (
            f" and attached to the sweep's parent run; compare in the MLflow UI: {ui_line(uri, report.view_url)}"
            if cfg.attach
            else ""
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
