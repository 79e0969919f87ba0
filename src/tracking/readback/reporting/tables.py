"""The report's tables: the summary (a row per job across its rounds), speedups over the baseline, the rounds
and a job's one-line description, with the marks (BUSY, FALLBACK, below the quality floor) a reader sees first.
"""

from __future__ import annotations

import math

from src.common.mdtext import md_text
from src.common.metrics import markdown_table
from src.tracking.readback.compare import JobRounds, Speedup, Spread, condition
from src.tracking.readback.reporting.rows import SUMMARY, _marked, _sig3, fallback, kernels_of
from src.tracking.readback.speed_quality import fields


def _drop_empty(rows: list[list], headers: list[str], fixed: int = 4) -> tuple[list[list], list[str]]:
    """The summary without the metric columns no job has (all NaN: perplexity in a timing sweep)."""
    keep = [
        i
        for i, h in enumerate(headers)
        if i < fixed or any(not (isinstance(r[i], float) and math.isnan(r[i])) for r in rows)
    ]
    return [[r[i] for i in keep] for r in rows], [headers[i] for i in keep]


def summary_rows(groups: list[JobRounds], flags: dict[str, str] | None = None) -> tuple[list[list], list[str]]:
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


def rounds_lines(groups: list[JobRounds], rounds: int) -> list[str]:
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


def _headline(config: JobRounds, gain: Speedup | None) -> tuple[Spread, list[str]]:
    """The job's headline figure: its speedup where it has one (with the sides timed busy: its baseline's
    busy rounds count), else its time per token."""
    if gain is not None and not gain.is_baseline and not math.isnan(gain.time.median):
        return gain.time, gain.busy_sides()
    return config.spread("time_per_token_ms_median"), []


def marker(config: JobRounds, gain: Speedup | None) -> str:
    """How far the job's headline figure can be trusted, in the few characters a table shows first:
    `⚠ BUSY baseline, 1 round`, `1 round`, or '' (several quiet rounds)."""
    figure, sides = _headline(config, gain)
    said = condition(figure, sides)
    return f"⚠ {said}" if figure.all_busy else said


def busy_figure(config: JobRounds, gain: Speedup | None) -> bool:
    """Whether the job's headline figure stands on busy timings only."""
    return _headline(config, gain)[0].all_busy


def describe(config: JobRounds, gain: Speedup | None, baseline: dict[str, str], flag: str = "") -> str:
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
        f"{' '.join((config.choice('precision'), *fields(config)))}"
        f"{'' if engine in ('native', '?') else ' on ' + engine} · "
        f"{'no draft' if draft == 'none' else 'draft ' + draft} · {run.tags.get('ran_on', config.choice('hardware'))}"
    )
    # MLflow's UI renders a description as markdown: the names in it are text (src.common.mdtext)
    return md_text(" · ".join(part for part in (flag, said, figure, what) if part))
