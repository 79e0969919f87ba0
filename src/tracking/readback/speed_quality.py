"""A sweep's quality beside its speed: the quality table, the speed–quality front, the flag on jobs below
their reference, and paired comparisons between jobs (src.quality's arithmetic on the runs' records).

A configuration is a job's choices but its task: its speed comes from a timed task (decode, benchmark:
time/token over its rounds) and its quality from a quality task (perplexity: KL divergence, Δ perplexity;
lm_eval: accuracy) of the same sweep. Where a configuration has no timed job, the front uses its quality
job's own scoring pass (perplexity_eval_s per token) and says so on the axis.
"""

from __future__ import annotations

import csv
import io
import json
import math
import os
from dataclasses import dataclass
from itertools import combinations
from pathlib import Path

from src.common.axes import AXES
from src.common.metrics import markdown_table
from src.quality import front, paired
from src.tracking.readback.compare import NO_SPREAD, JobRounds, Spread

# MLflow draws a progress bar per download: three lines of noise per job in a report printed when a sweep ends
# (unless the user asked for them)
os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")

# The front's quality figures (report setting quality.metric), each with whether lower is better
METRICS = {"kl_mean": True, "delta_perplexity": True, "perplexity": True, "divergent_share": True, "accuracy": False}
TIMED = ("time_per_token_ms_median",)


def fields(config: JobRounds) -> tuple[str, ...]:
    """The fields its sweep varied, as its name gives them (`head_format=w8a16`: src.tracking.sweep.naming)."""
    return tuple(part for part in config.name.split(" round ")[0].split("·") if "=" in part)


def identity(config: JobRounds, **instead: str) -> tuple[str, ...]:
    """What the configuration is, whatever task measured it: its choices but the task (any of them replaced
    by `instead`), and the fields its sweep varied."""
    return (*(instead.get(g, config.choice(g)) for g in AXES if g != "task"), *fields(config))


def label(config: JobRounds) -> str:
    """The configuration's name without its task (model·hardware·precision·draft[·engine][·field=value])."""
    engine = config.choice("engine")
    return "·".join(
        [config.choice(g) for g in ("model", "hardware", "precision", "draft")]
        + ([engine] if engine not in ("native", "?") else [])
        + list(fields(config))
    )


def _figure(config: JobRounds, metric: str) -> tuple[float, float]:
    """The metric and its standard error (median over rounds; quality is not timed, rounds agree)."""
    return config.spread(metric).median, config.spread(f"{metric}_se").median


def quality_ratios(groups: list[JobRounds], reference_precision: str) -> dict[tuple, tuple[float, str]]:
    """Each configuration's quality as a fraction of its reference's (1: as good), and what that reference
    is: perplexity jobs log it against their own reference pass (task.reference); accuracy against the
    sweep's job at the reference precision."""
    out: dict[tuple, tuple[float, str]] = {}
    by_id = {}
    for c in groups:
        by_id.setdefault((identity(c), c.choice("task")), c)
    for c in groups:
        ratio = c.spread("quality_ratio").median
        # the reference tag reads "<model> <precision> (torch, ...)"
        against = (c.shown.tags.get("reference", "").split(" ") + ["", ""])[1] or reference_precision
        if math.isnan(ratio) and not math.isnan(c.spread("accuracy").median):
            against = reference_precision
            ref_id = identity(c, precision=reference_precision)
            ref = by_id.get((ref_id, c.choice("task")))
            base = ref.spread("accuracy").median if ref else math.nan
            ratio = c.spread("accuracy").median / base if base and not math.isnan(base) else math.nan
        if not math.isnan(ratio) and ratio < out.get(identity(c), (math.inf, ""))[0]:
            out[identity(c)] = (ratio, against)  # the worst of its quality tasks
    return out


def flags(groups: list[JobRounds], ratios: dict[tuple, tuple[float, str]], min_ratio: float) -> dict[str, str]:
    """config key -> `⚠ QUALITY 0.95 of fp32` for every job (timed or not) whose configuration fell below
    min_ratio of its reference: said wherever its speed is shown."""
    out = {}
    for c in groups:
        r, against = ratios.get(identity(c), (math.nan, ""))
        if not math.isnan(r) and r < min_ratio:
            out[c.key] = f"⚠ QUALITY {r:.3g} of {against}"
    return out


def _pm(value: float, se: float, digits: int = 3) -> str:
    if math.isnan(value):
        return "-"
    return f"{value:.{digits}g} ± {se:.2g}" if not math.isnan(se) else f"{value:.{digits}g}"


def _in(value: float, low: float, high: float) -> str:
    """A share with its interval (Wilson's); a run from before intervals were logged shows the share alone."""
    if math.isnan(value):
        return "-"
    return f"{value:.4g} ({low:.4g}–{high:.4g})" if not math.isnan(low) else f"{value:.4g}"


def quality_table(
    groups: list[JobRounds], ratios: dict[tuple, tuple[float, str]], min_ratio: float, reference: str
) -> str:
    """One row per quality measurement: KL (mean ± se, p99 with its 95% interval), top-1 agreement, Δppl ±
    se, the quality ratio; accuracy ± se; generation divergence. Empty where no job measured any."""
    rows = []
    for c in groups:
        have = [m for m in ("kl_mean", "accuracy", "divergent_share") if not math.isnan(c.spread(m).median)]
        if not have:
            continue
        p99, lo, hi = (c.spread(k).median for k in ("kl_p99", "kl_p99_low", "kl_p99_high"))
        ratio = ratios.get(identity(c), (math.nan, ""))[0]
        # accuracy has no reference pass of its own: the sweep's job at the reference precision is its reference
        rows.append(
            [
                c.name,
                c.shown.tags.get("reference", f"the {reference} job"),
                _pm(*_figure(c, "kl_mean")),
                "-" if math.isnan(p99) else f"{p99:.3g} ({lo:.3g}–{hi:.3g})",
                _in(*(c.spread(k).median for k in ("top1_agreement", "top1_agreement_low", "top1_agreement_high"))),
                _pm(*_figure(c, "delta_perplexity")),
                _pm(*_figure(c, "accuracy")),
                _pm(*_figure(c, "first_divergent_token")),
                _pm(*_figure(c, "divergent_share")),
                "-" if math.isnan(ratio) else f"{ratio:.4g}" + (" ⚠" if ratio < min_ratio else ""),
            ]
        )
    if not rows:
        return ""
    headers = [
        "job",
        "reference",
        "KL mean ± se",
        "KL p99 (95% CI)",
        "top-1 agreement (95% CI)",
        "Δ perplexity ± se",
        "accuracy ± se",
        "first divergent token ± se",
        "divergent share ± se",
        "quality ratio",
    ]
    keep = [i for i in range(len(headers)) if i < 2 or any(r[i] != "-" for r in rows)]
    return markdown_table([headers[i] for i in keep], [[r[i] for i in keep] for r in rows])


@dataclass
class Point:
    name: str  # the configuration
    speed: Spread  # time/token (ms) over its rounds
    speed_source: str  # "decode", or "scoring pass" where no timed job ran
    quality: float
    quality_se: float
    on_front: bool = False
    flag: str = ""
    quality_key: str = ""  # the quality job's config key (its run carries the point in the view)


def points(groups: list[JobRounds], metric: str, flagged: dict[str, str]) -> list[Point]:
    """One point per configuration with a quality figure and a time/token; the front marked among them."""
    lower = METRICS[metric]
    timed: dict[tuple, JobRounds] = {}
    for c in groups:
        if not math.isnan(c.spread(TIMED[0]).median):
            timed.setdefault(identity(c), c)
    out = []
    for c in groups:
        value, se = _figure(c, metric)
        if math.isnan(value):
            continue
        t = timed.get(identity(c))
        if t is not None:
            speed, source = t.spread(TIMED[0]), t.choice("task")
        else:
            tokens, seconds = c.spread("perplexity_tokens").median, c.spread("perplexity_eval_s")
            speed = (
                NO_SPREAD
                if math.isnan(tokens)
                else Spread(
                    seconds.median / tokens * 1e3, seconds.low / tokens * 1e3, seconds.high / tokens * 1e3, seconds.used
                )
            )
            source = "scoring pass"
        if speed.used:  # a front needs both figures: an lm_eval job alone has no time of its own
            out.append(Point(label(c), speed, source, value, se, flag=flagged.get(c.key, ""), quality_key=c.key))
    best = front.pareto({p.name: (p.speed.median, p.quality if lower else -p.quality) for p in out})
    for p in out:
        p.on_front = p.name in best
    return sorted(out, key=lambda p: (math.isnan(p.speed.median), p.speed.median))


def front_of(groups: list[JobRounds], metric: str, flagged: dict[str, str]) -> tuple[str, list[Point]]:
    """The front on `metric`, or where no job measured it, on the first figure of METRICS that one did
    (an lm_eval sweep has accuracy only): the figure used, and its points."""
    for name in (metric, *METRICS):
        pts = points(groups, name, flagged)
        if pts:
            return name, pts
    return metric, []


def speed_axis(pts: list[Point]) -> str:
    sources = sorted({p.speed_source for p in pts})
    return "time/token (ms)" + ("" if sources == ["decode"] else f" [{', '.join(sources)}]")


def front_table(pts: list[Point], metric: str) -> str:
    rows = [
        [
            ("★ " if p.on_front else "") + (f"[{p.flag}] " if p.flag else "") + p.name,
            p.speed.text(),
            p.speed_source,
            _pm(p.quality, p.quality_se),
            "yes" if p.on_front else "",
        ]
        for p in pts
    ]
    return markdown_table(["configuration", "time/token (ms)", "timed by", f"{metric} ± se", "on the front"], rows)


def front_plot(pts: list[Point], metric: str, path: Path, save) -> Path | None:
    """Time/token (its min–max over rounds) against the quality figure (± se), the front joined by a line,
    flagged configurations drawn as red crosses."""
    drawn = [p for p in pts if not math.isnan(p.speed.median)]
    if not drawn:
        return None

    from matplotlib.figure import Figure  # not at the top: 1.2 s a process pays, drawing or not

    fig = Figure(figsize=(7, 4.5))
    ax = fig.subplots()
    for p in drawn:
        ax.errorbar(
            p.speed.median,
            p.quality,
            xerr=[[p.speed.median - p.speed.low], [p.speed.high - p.speed.median]],
            yerr=None if math.isnan(p.quality_se) else p.quality_se,
            fmt="x" if p.flag else "o",
            color="tab:red" if p.flag else ("tab:blue" if p.on_front else "tab:gray"),
            capsize=3,
        )
        ax.annotate(
            p.name.split("·", 2)[-1] + (" ⚠" if p.flag else ""),
            (p.speed.median, p.quality),
            fontsize=7,
            xytext=(4, 4),
            textcoords="offset points",
        )
    line = sorted((p for p in drawn if p.on_front), key=lambda p: p.speed.median)
    ax.plot([p.speed.median for p in line], [p.quality for p in line], color="tab:blue", linewidth=0.8)
    ax.set_xlabel(speed_axis(drawn) + "; whiskers: min–max over rounds")
    ax.set_ylabel(f"{metric} ({'lower' if METRICS[metric] else 'higher'} is better); whiskers ± se")
    ax.set_title("speed–quality front (blue line); red ✕: below quality.min_ratio of the reference")
    ax.grid(True, alpha=0.3)
    save(fig, path)
    return path


def _artifact(client, run_id: str, name: str) -> str:
    return Path(client.download_artifacts(run_id, name)).read_text()


def _per_token(client, run_id: str) -> dict[str, list[float]] | None:
    """A perplexity job's per_token.csv as columns (None for a run that kept none)."""
    try:
        text = _artifact(client, run_id, "per_token.csv")
    except Exception:  # noqa: BLE001 - a run from before per-token records, or one that kept none
        return None
    rows = list(csv.DictReader(io.StringIO(text)))
    if not rows or "kl" not in rows[0]:
        return None
    return {k: [float(r[k]) for r in rows] for k in ("kl", "reference_nll")}


def _items(client, run_id: str) -> dict[tuple, tuple[str, float]] | None:
    """An lm_eval job's items: (task, doc) -> (target, whether it got it)."""
    try:
        text = _artifact(client, run_id, "lm_eval_samples.jsonl")
    except Exception:  # noqa: BLE001 - see _per_token
        return None
    docs = [json.loads(line) for line in text.splitlines() if line.strip()]
    return {(d["task"], d["doc_id"]): (d.get("target"), d["acc"]) for d in docs if "acc" in d}


def _same_tokens(x: dict, y: dict) -> bool:
    """The same tokens under the same reference: their reference NLLs agree token by token (the windows'
    count alone could match over another dataset or window size)."""
    a, b = x["reference_nll"], y["reference_nll"]
    return len(a) == len(b) and all(math.isclose(u, v, rel_tol=1e-5, abs_tol=1e-6) for u, v in zip(a, b))


def paired_table(client, groups: list[JobRounds], limit: int = 28, keep=None) -> str:
    """Every two quality jobs of the same model and task, on the same tokens or items, compared paired:
    per-token KL (a paired permutation test and a bootstrap interval; A − B < 0: A departs less from the reference) and per-item accuracy
    (exact McNemar). keep(a, b): only the pairs it accepts (a benchmark's chosen questions), each in its order."""
    rows = []
    quality = [
        c for c in groups if not math.isnan(c.spread("kl_mean").median) or not math.isnan(c.spread("accuracy").median)
    ]
    read: dict[str, object] = {}  # each run's records, downloaded once

    def records(config: JobRounds):
        run_id = config.shown.run_id
        if run_id not in read:
            read[run_id] = (_per_token if config.choice("task") == "perplexity" else _items)(client, run_id)
        return read[run_id]

    for a, b in combinations(quality, 2):
        if keep is not None and not keep(a, b):
            if not keep(b, a):
                continue
            a, b = b, a
        if (a.choice("model"), a.choice("task")) != (b.choice("model"), b.choice("task")) or len(rows) >= limit:
            continue
        x, y = records(a), records(b)
        if not x or not y:
            continue
        if a.choice("task") == "perplexity":
            if not _same_tokens(x, y):
                continue
            p, what = paired.means(x["kl"], y["kl"]), "per-token KL"
            diff = f"{p.difference:.3g} ({p.low:.3g}–{p.high:.3g})"
        else:
            if set(x) != set(y) or any(x[k][0] != y[k][0] for k in x):
                continue
            keys = sorted(x)
            p, what = paired.mcnemar([x[k][1] > 0.5 for k in keys], [y[k][1] > 0.5 for k in keys]), "per-item accuracy"
            diff = f"{p.difference:+.3g}"
        rows.append([label(a), label(b), what, p.test, p.n, diff, p.p_text()])
    if not rows:
        return ""
    return markdown_table(["A", "B", "compared", "test", "n", "A − B (95% CI)", "p"], rows)
