"""Compare a sweep with a baseline sweep: is this commit, library or machine slower than before?

    python -m src.tracking.regress baseline=<sweep dir or id, or its parent run id>          # against the latest sweep
    python -m src.tracking.regress baseline=multirun/2026-11-20/10-00-00-1 sweep=multirun/2026-11-25/... fail_on=0.05

Jobs are matched by their composed config, without what names the sweep (its directory, rounds, store, cache):
the same model, hardware, precision, draft, task, engine, dataset and sampling with the same fields. For each
matched job: the ratio of time/token (and prefill, and the quality figure where both have one), new over
baseline, with its interval from the per-round figures (or, with one round on a side, the per-example ones):
paired by example where both sweeps ran the same examples (each example's new / baseline, each side the median
of its rounds), else the ratio of the rounds' medians; the median ratio with a bootstrap interval at `confidence`. The verdict is `slower` where the whole interval is
above 1 + `tolerance` (0.03), `faster` where it is below 1 - `tolerance`, `no change` otherwise: the interval holds
the examples' and rounds' spread, not what moves a whole sweep minutes later. New, removed and failed jobs are listed, and what
can change a figure on the same code (the host's governor, turbo, transparent huge pages, kernel, library
versions, the commit and a dirty tree: params `host.*`, tag git_commit) is compared between the two sweeps.

Exit 0, or 1 where a matched job is slower with confidence by more than `fail_on` (a fraction: 0.05 = 5%;
null: never), or 2 for a setting that does not exist or a sweep that cannot be found (one line). The gate
(`fail_on`) fails closed: exit 3 where it could not judge a job (failed, killed or missing in the new sweep,
or a time/token with no interval: one round and fewer than three examples on a side) or nothing matched,
unless `unjudged=pass`; what it could not judge is listed in the report either way. Writes
`regress.md`, `regress.csv` and `regress.png` (both sweeps side by side) under `<out>/regress-<key>/`.
"""

from __future__ import annotations

import csv
import hashlib
import io
import json
import math
import statistics
import sys
from dataclasses import dataclass, field
from pathlib import Path

from matplotlib.figure import Figure  # no pyplot: figures are written to files, never shown
from mlflow.tracking import MlflowClient

from src.common import envvars
from src.common.environment import PROJECT_ROOT
from src.common.metrics import markdown_table
from src.quality.stats import median_ratio_ci, quantile_ci
from src.tracking import ROLE, SWEEP_ID, default_uri, key_of, latest_attempts
from src.tracking.compare import busy, quiet, round_of
from src.tracking.report import store_problem
from src.tracking.sweeps import JobRecord, find_sweep

# tolerance: a ratio is slower (faster) only where its whole interval lies above 1 + tolerance (below
# 1 - tolerance); anything else is no change. The intervals hold the
# examples' and rounds' spread, not what moves a whole sweep (the host's state minutes apart): two sweeps of
# the same code on the same host here differed by 0.2-1.3% with intervals a few tenths of a percent wide.
SETTINGS = {
    "baseline": None,
    "sweep": None,
    "tracking_uri": None,
    "experiment": "quantspec",
    "confidence": 0.95,
    "tolerance": 0.03,
    "fail_on": None,
    "unjudged": "fail",
    "out": "reports",
}
MEANING = {  # each setting's help line (--help lists them with their defaults)
    "baseline": "the sweep to compare against: its directory, its id or its parent run's id (required)",
    "sweep": "the new sweep, named the same ways (null: the latest sweep)",
    "tracking_uri": "the store both sweeps are in (null: MLFLOW_TRACKING_URI, else the project's mlflow.db)",
    "experiment": "the MLflow experiment they were recorded under",
    "confidence": "the bootstrap interval's level, in [0.5, 1)",
    "tolerance": "how far past 1 the whole interval must lie for slower or faster (a fraction)",
    "fail_on": "exit 1 where a job is slower with confidence by more than this fraction (null: never)",
    "unjudged": "fail (exit 3) or pass where the gate could not judge a job",
    "out": "the folder the regress-<key>/ files are written under",
}


def usage() -> str:
    width = max(map(len, SETTINGS))
    lines = [f"    {k}={'null' if v is None else v}".ljust(width + 14) + MEANING[k] for k, v in SETTINGS.items()]
    return f"{__doc__.strip()}\n\nSettings (key=value), with their defaults:\n\n" + "\n".join(lines)


# The params that make a job what it is; what names the sweep or where it ran is not part of it.
IDENTITY = ("model.", "hardware.", "precision.", "draft.", "task.", "engine.", "dataset.", "sampling.")
FIGURES = (
    ("time/token", "time_per_token_ms_median", "by_example/time_per_token_ms"),
    ("prefill", "prefill_ms_median", "by_example/prefill_ms"),
)
QUALITY = ("kl_mean", "perplexity", "divergent_share", "accuracy")


class SettingError(ValueError):
    """A setting that is not one; the message is the one line the user sees."""


def settings(argv: list[str]) -> dict:
    cfg = dict(SETTINGS)
    for arg in argv:
        key, eq, value = arg.partition("=")
        if not eq or key not in cfg:
            raise SettingError(
                f"{arg!r} is not a setting; settings: {', '.join(f'{k}=' for k in SETTINGS)} "
                f"(python -m src.tracking.regress --help)"
            )
        cfg[key] = None if value in ("", "null", "none") else value
    if not cfg["baseline"]:
        raise SettingError(
            "baseline=<sweep directory, sweep id or parent run id> is needed: the sweep to compare against"
        )
    try:
        cfg["confidence"] = float(cfg["confidence"])
        cfg["tolerance"] = float(cfg["tolerance"])
        cfg["fail_on"] = None if cfg["fail_on"] is None else float(cfg["fail_on"])
    except ValueError as err:
        raise SettingError(f"confidence, tolerance and fail_on are numbers ({err})") from None
    for key in ("confidence", "tolerance", "fail_on"):  # nan fails every comparison: it would switch a check off
        if cfg[key] is not None and not math.isfinite(cfg[key]):
            raise SettingError(f"{key}={cfg[key]} must be a finite number")
    if cfg["unjudged"] not in ("fail", "pass"):
        raise SettingError(f"unjudged={cfg['unjudged']} must be fail or pass")
    if not 0.5 <= cfg["confidence"] < 1:
        raise SettingError(f"confidence={cfg['confidence']} must be in [0.5, 1)")
    if not 0 <= cfg["tolerance"] < 1:
        raise SettingError(f"tolerance={cfg['tolerance']} must be in [0, 1) (a fraction: 0.03 is 3%)")
    if cfg["fail_on"] is not None and cfg["fail_on"] < 0:
        raise SettingError(f"fail_on={cfg['fail_on']} must be 0 or more (a fraction: 0.05 is 5% slower)")
    return cfg


def identity(params: dict[str, str]) -> str:
    """A job's identity across sweeps: its config's params that say what ran, hashed."""
    kept = {k: v for k, v in params.items() if k.startswith(IDENTITY)}
    return hashlib.sha256(json.dumps(kept, sort_keys=True).encode()).hexdigest()[:16]


@dataclass
class Job:
    """One job of a sweep: its rounds' runs (the latest attempt of each)."""

    name: str
    runs: list[JobRecord] = field(default_factory=list)

    @property
    def finished(self) -> list[JobRecord]:
        return [r for r in self.runs if r.tags.get("outcome") == "finished"]

    @property
    def outcome(self) -> str:
        return "finished" if self.finished else (self.runs[-1].tags.get("outcome", "?") if self.runs else "?")


@dataclass
class Sweep:
    sweep_id: str
    parent_id: str
    jobs: dict[str, Job]
    host: dict[str, str]  # what can change a figure on the same code


def _resolve(client: MlflowClient, experiment: str, ref: str | None):
    """A sweep named by its directory (relative or absolute), its id, or its parent run id; None: the latest."""
    if ref and not ref.startswith(("/", ".")) and len(ref) == 32 and all(c in "0123456789abcdef" for c in ref):
        try:
            run = client.get_run(ref)
            if run.data.tags.get(ROLE) == "sweep":
                return run.info.experiment_id, run
        except Exception:  # noqa: BLE001 - not a run id: a sweep id after all
            pass
    sweep_id = str(Path(ref).resolve()) if ref and Path(ref).exists() else ref
    return find_sweep(client, experiment, sweep_id)


def load(client: MlflowClient, experiment: str, ref: str | None) -> Sweep:
    experiment_id, parent = _resolve(client, experiment, ref)
    runs = latest_attempts(
        client.search_runs(
            [experiment_id], max_results=5000, filter_string=f"tags.mlflow.parentRunId = '{parent.info.run_id}'"
        )
    )
    jobs: dict[str, Job] = {}
    host: dict[str, str] = {}
    for r in runs:
        record = JobRecord(r.info.run_id, r.info.run_name, dict(r.data.tags), dict(r.data.metrics), dict(r.data.params))
        key = identity(record.params)
        name = r.info.run_name.removesuffix(f" round {round_of(record)}")
        jobs.setdefault(key, Job(name)).runs.append(record)
        for k, v in record.params.items():
            if k.startswith("host."):
                host.setdefault(k, v)
        for tag in ("git_commit", "cpu_model"):
            if tag in record.tags:
                host.setdefault(tag, record.tags[tag])
    return Sweep(parent.data.tags.get(SWEEP_ID, parent.info.run_id), parent.info.run_id, jobs, host)


def quiet_runs(job: Job) -> list[JobRecord]:
    """The job's finished rounds timed on a quiet host; all of them where every round was busy."""
    return quiet(job.finished)


def per_round(job: Job, summary: str) -> list[float]:
    return [r.metrics[summary] for r in quiet_runs(job) if summary in r.metrics]


def per_example(client: MlflowClient, job: Job, series: str) -> dict[int, float]:
    """Each example's figure (step = example number), the median over the job's quiet rounds."""
    values: dict[int, list[float]] = {}
    for run in quiet_runs(job):
        for m in client.get_metric_history(run.run_id, series):
            if not math.isnan(m.value):
                values.setdefault(m.step, []).append(m.value)
    return {step: statistics.median(v) for step, v in values.items()}


PAIRED_MIN = 3  # examples in both sweeps for the paired ratio; fewer: the rounds' figures, unpaired


def ratio_of(client: MlflowClient, old: Job, new: Job, summary: str, series: str, confidence: float):
    """(baseline, new, ratio, low, high, over): paired by example where both sweeps ran the same three or more
    examples (each example's new / baseline, each side the median of its rounds: the prompts' own spread
    cancels), else the ratio of the rounds' medians with each side resampled; None where a side has nothing."""
    a, b = per_example(client, old, series), per_example(client, new, series)
    common = sorted(set(a) & set(b))
    rounds = f"{len(quiet_runs(old))} / {len(quiet_runs(new))} rounds"
    busy_runs = [sum(busy(r) for r in job.finished) for job in (old, new)]
    if any(busy_runs):  # a side whose every round was busy keeps them: said beside its ratio
        rounds += f", {busy_runs[0]} / {busy_runs[1]} busy"
    if len(common) >= PAIRED_MIN and all(a[s] > 0 for s in common):
        ratio, low, high = quantile_ci([b[s] / a[s] for s in common], 0.5, confidence)
        return (
            statistics.median(a[s] for s in common),
            statistics.median(b[s] for s in common),
            ratio,
            low,
            high,
            f"{len(common)} examples, paired ({rounds})",
        )
    old_values, new_values = per_round(old, summary), per_round(new, summary)
    if not old_values or not new_values:
        return None
    ratio, low, high = median_ratio_ci(new_values, old_values, confidence)
    return statistics.median(old_values), statistics.median(new_values), ratio, low, high, rounds


@dataclass
class Row:
    name: str
    figure: str
    baseline: float
    new: float
    ratio: float
    low: float
    high: float
    basis: str
    verdict: str


def verdict(low: float, high: float, tolerance: float = 0.0) -> str:
    """slower: the whole interval above 1 + tolerance; faster: below 1 - tolerance; else no change."""
    if math.isnan(low):
        return "no interval"
    return "slower" if low > 1 + tolerance else "faster" if high < 1 - tolerance else "no change"


@dataclass
class Comparison:
    baseline: Sweep
    new: Sweep
    rows: list[Row]
    added: list[str]
    removed: list[str]
    failed: list[str]
    host_changes: list[tuple[str, str, str]]
    confidence: float
    tolerance: float = 0.0
    unjudged: list[str] = field(default_factory=list)  # what the gate could not judge, and why

    def slower_than(self, fraction: float) -> list[Row]:
        return [r for r in self.rows if r.figure == "time/token" and r.verdict == "slower" and r.low > 1 + fraction]


def compare(client: MlflowClient, base: Sweep, new: Sweep, confidence: float, tolerance: float = 0.03) -> Comparison:
    rows, unjudged = [], []
    for key in sorted(set(base.jobs) & set(new.jobs), key=lambda k: new.jobs[k].name):
        old_job, new_job = base.jobs[key], new.jobs[key]
        if not new_job.finished:
            unjudged.append(f"{new_job.name}: {new_job.outcome} in the new sweep")
            continue
        if not old_job.finished:
            continue  # the baseline's failure is listed below; nothing to hold the new job to
        for figure, summary, series in FIGURES:
            found = ratio_of(client, old_job, new_job, summary, series, confidence)
            if found is not None:
                a, b, ratio, low, high, over = found
                rows.append(Row(new_job.name, figure, a, b, ratio, low, high, over, verdict(low, high, tolerance)))
                if figure == "time/token" and math.isnan(low):
                    unjudged.append(
                        f"{new_job.name}: no interval for its time/token ({over}); rounds=3 or more examples give one"
                    )
            elif figure == "time/token":
                unjudged.append(f"{new_job.name}: no time/token on a side")
        for metric in QUALITY:
            old_q = [r.metrics[metric] for r in old_job.finished if metric in r.metrics]
            new_q = [r.metrics[metric] for r in new_job.finished if metric in r.metrics]
            if old_q and new_q:
                a, b = statistics.median(old_q), statistics.median(new_q)
                rows.append(
                    Row(
                        new_job.name,
                        metric,
                        a,
                        b,
                        b / a if a else math.nan,
                        math.nan,
                        math.nan,
                        "the runs' own figures",
                        "equal" if a == b else "differs",
                    )
                )
    added = sorted(new.jobs[k].name for k in set(new.jobs) - set(base.jobs))
    removed = sorted(base.jobs[k].name for k in set(base.jobs) - set(new.jobs))
    failed = sorted(
        f"{j.name} ({side}: {j.outcome})"
        for side, sweep in (("baseline", base), ("new", new))
        for j in sweep.jobs.values()
        if j.outcome in ("failed", "killed")
    )
    changes = [
        (k, base.host.get(k, "(not recorded)"), new.host.get(k, "(not recorded)"))
        for k in sorted(set(base.host) | set(new.host))
        if base.host.get(k) != new.host.get(k)
    ]
    unjudged += [f"{name}: not in the new sweep" for name in removed]
    if not any(r.figure == "time/token" for r in rows):
        unjudged.insert(0, "no job finished in both sweeps with a time/token")
    return Comparison(base, new, rows, added, removed, failed, changes, confidence, tolerance, unjudged)


def markdown(c: Comparison) -> str:
    level = f"{c.confidence:.0%}"
    lines = [
        f"# {c.new.sweep_id} against {c.baseline.sweep_id}",
        "",
        f"Ratios are new / baseline: above 1 is slower (or, for a quality figure, higher), with a {level} "
        f"bootstrap interval: of the median of the examples' ratios where both sweeps ran the same examples "
        f"(each side the median of its quiet rounds), else of the ratio of the rounds' medians. Verdicts: slower "
        f"or faster where the whole interval is beyond 1 ± {c.tolerance:g} (tolerance), no change otherwise.",
        "",
    ]
    if c.rows:
        lines += [
            markdown_table(
                ["job", "figure", "baseline", "new", "new / baseline", f"{level} interval", "over", "verdict"],
                [
                    [
                        r.name,
                        r.figure,
                        f"{r.baseline:.4g}",
                        f"{r.new:.4g}",
                        f"{r.ratio:.3f}",
                        "–" if math.isnan(r.low) else f"{r.low:.3f}–{r.high:.3f}",
                        r.basis,
                        r.verdict,
                    ]
                    for r in c.rows
                ],
            ),
            "",
        ]
    else:
        lines += ["No job finished in both sweeps.", ""]
    for title, items in (
        ("Not judged (a gate, fail_on, fails on these unless unjudged=pass)", c.unjudged),
        ("New jobs (not in the baseline)", c.added),
        ("Removed jobs (only in the baseline)", c.removed),
        ("Failed or killed jobs", c.failed),
    ):
        if items:
            lines += [f"## {title}", "", *[f"- {i}" for i in items], ""]
    lines += ["## What differs between the two sweeps' hosts", ""]
    if c.host_changes:
        lines += [
            markdown_table(["", "baseline", "new"], [list(ch) for ch in c.host_changes]),
            "",
            "A ratio between sweeps measured under different conditions is the code's change only where these "
            "do not matter.",
            "",
        ]
    else:
        lines += ["Nothing recorded differs (governor, turbo, huge pages, kernel, library versions, commit, CPU).", ""]
    return "\n".join(lines)


def plot(c: Comparison, path: Path) -> None:
    rows = [r for r in c.rows if r.figure == "time/token"]
    fig = Figure(figsize=(max(6, 1.2 * len(rows) + 2), 4))
    ax = fig.subplots()
    x = range(len(rows))
    ax.bar([i - 0.2 for i in x], [r.baseline for r in rows], 0.4, label="baseline")
    ax.bar(
        [i + 0.2 for i in x],
        [r.new for r in rows],
        0.4,
        label="new",
        color=[
            "tab:red" if r.verdict == "slower" else "tab:green" if r.verdict == "faster" else "tab:gray" for r in rows
        ],
    )
    ax.set_xticks(list(x), [r.name for r in rows], rotation=30, ha="right", fontsize=7)
    ax.set_ylabel("time/token (ms), median")
    ax.set_title("new (red: slower, green: faster, gray: no change) against the baseline")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def write(c: Comparison, out: Path) -> Path:
    folder = out / f"regress-{key_of(c.baseline.sweep_id + ' ' + c.new.sweep_id)[:12]}"
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "regress.md").write_text(markdown(c))
    buf = io.StringIO()
    writer = csv.writer(buf)
    writer.writerow(["job", "figure", "baseline", "new", "ratio", "low", "high", "over", "verdict"])
    for r in c.rows:
        writer.writerow([r.name, r.figure, r.baseline, r.new, r.ratio, r.low, r.high, r.basis, r.verdict])
    (folder / "regress.csv").write_text(buf.getvalue())
    plot(c, folder / "regress.png")
    return folder


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
    uri = cfg["tracking_uri"] or default_uri()
    if (line := store_problem(uri)) is not None:
        print(f"quantspec: {line}", file=sys.stderr)
        return 2
    client = MlflowClient(uri)
    try:
        base = load(client, cfg["experiment"], cfg["baseline"])
        new = load(client, cfg["experiment"], cfg["sweep"])
    except LookupError as err:
        print(f"quantspec: {err}", file=sys.stderr)
        return 2
    if base.parent_id == new.parent_id:
        print(
            f"quantspec: baseline and sweep are the same sweep ({base.sweep_id}); name another with sweep=...",
            file=sys.stderr,
        )
        return 2
    c = compare(client, base, new, cfg["confidence"], cfg["tolerance"])
    folder = write(c, PROJECT_ROOT / cfg["out"])
    print(markdown(c))
    print(f"written to {folder}")
    if cfg["fail_on"] is not None:
        slow = c.slower_than(cfg["fail_on"])
        if slow:
            print(
                f"quantspec: {len(slow)} job(s) slower than the baseline by more than {cfg['fail_on']:.0%} at "
                f"{c.confidence:.0%} confidence: {', '.join(r.name for r in slow)}",
                file=sys.stderr,
            )
            return 1
        if c.unjudged and cfg["unjudged"] == "fail":  # fail closed: what the gate could not see, it does not pass
            print(
                f"quantspec: the gate could not judge {len(c.unjudged)} thing(s): {c.unjudged[0]}"
                + (f" (and {len(c.unjudged) - 1} more, in regress.md)" if len(c.unjudged) > 1 else "")
                + "; fix the sweeps, or pass unjudged=pass to let the gate pass them",
                file=sys.stderr,
            )
            return 3
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
