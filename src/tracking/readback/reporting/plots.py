"""The report's PNG plots, drawn on matplotlib Figures written to files (no pyplot: nothing is shown), every
label inside its image; a figure timed on a busy host is hatched.
"""

from __future__ import annotations

import math
import textwrap
from pathlib import Path

from mlflow.tracking import MlflowClient

from src.common.metrics import Row
from src.tracking.readback import speed_quality as q
from src.tracking.readback.compare import Speedup
from src.tracking.readback.reporting.rows import _marked
from src.tracking.readback.reporting.tables import busy_figure, marker
from src.tracking.readback.sweeps import JobRecord
from src.tracking.store.names import (
    CONFIG_KEY,
)


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
    from matplotlib.figure import Figure  # not at the top: 1.2 s a process pays, drawing or not

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
    """flags: config key -> its quality flag (src.tracking.readback.speed_quality.flags), said on its bars too."""
    flags = flags or {}
    flagged = {
        j.name: flags[j.tags.get(CONFIG_KEY, j.run_id)] for j in jobs if j.tags.get(CONFIG_KEY, j.run_id) in flags
    }
    drawn = []
    for metric, label in (("time_per_token_ms", "time/token (ms)"), ("prefill_ms", "prefill (ms)")):
        drawn += [
            _against_prompt(jobs, rows_of, metric, label, out),
            _by_job(jobs, rows_of, metric, label, out, flagged),
        ]
    drawn.append(_speedup_plot(speedups, out, base_text, flags))
    return {path.name: path for path in drawn if path is not None}


def _against_prompt(jobs: list[JobRecord], rows_of: dict[str, list[Row]], metric: str, label: str, out: Path):
    """Tasks with fixed prompt lengths (benchmark, benchmark_long): each job's curve against prompt length.
    None where no such job has two rows."""
    from matplotlib.figure import Figure  # not at the top: 1.2 s a process pays, drawing or not

    fig = Figure(figsize=(7, 4.5))
    ax = fig.subplots()
    drawn = 0
    for job in jobs:
        rows = rows_of.get(job.name) or []
        if len(rows) < 2 or job.choice("task") not in ("benchmark", "benchmark_long"):
            continue  # only fixed-length prompts make a curve against prompt length
        busy = job.tags.get("host_busy") == "true"
        what = " ".join((job.choice("precision"), *q.fields(job)))
        ax.plot(
            [r.prompt_tokens for r in rows],
            [getattr(r, metric) for r in rows],
            marker="o",
            linestyle="--" if busy else "-",
            label=("⚠ BUSY " if busy else "") + f"{what} · {job.choice('draft')} · {job.choice('hardware')}",
        )
        drawn += 1
    if not drawn:
        return None
    ax.set_xscale("log", base=2)
    ax.set_xlabel("prompt length (tokens)")
    ax.set_ylabel(label)
    ax.set_title(f"{label} against prompt length")
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8)
    path = out / f"{metric}_vs_prompt.png"
    _save(fig, path)
    return path


def _speedup_plot(speedups: list[Speedup], out: Path, base_text: str, flags: dict[str, str]):
    """Each job's time/token speedup over its baseline, whiskers the per-round range; None without one."""
    drawn = [u for u in speedups if not u.is_baseline and not math.isnan(u.time.median)]
    if not drawn:
        return None
    from matplotlib.figure import Figure  # not at the top: 1.2 s a process pays, drawing or not

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
    return path
