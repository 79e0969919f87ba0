"""Two sweeps' jobs matched by their composed config and judged: each figure's ratio, new over old, with
its interval, and a verdict (slower, faster, no change); new, removed and unjudged jobs; the hosts' differences.
"""

from __future__ import annotations

import hashlib
import json
import math
import statistics
from dataclasses import dataclass, field
from pathlib import Path

from mlflow.tracking import MlflowClient

from src.assembly.config import reads_dataset
from src.quality.stats import median_ratio_ci, quantile_ci
from src.tracking.readback.compare import busy, quiet, round_of
from src.tracking.readback.sweeps import JobRecord, find_sweep
from src.tracking.store.names import ROLE, SWEEP_ID, latest_attempts

# The params that make a job what it is; what names the sweep or where it ran is not part of it.
IDENTITY = ("model.", "hardware.", "precision.", "draft.", "task.", "engine.", "dataset.", "sampling.")


# (the figure's name, its summary metrics (a job has one of them: a decode's TTFT p99 over its examples' tokens, a
# serving level's over its requests), its per-example series (None where it has none, as a percentile over every
# example's tokens has not), and whether more is better: a throughput is worse where it falls)
FIGURES = (
    ("time/token", ("time_per_token_ms_median",), "by_example/time_per_token_ms", False),
    ("prefill", ("prefill_ms_median",), "by_example/prefill_ms", False),
    ("TTFT p99", ("ttft_ms_p99", "serve_ttft_ms_p99"), None, False),
    ("ITL p99", ("itl_ms_p99", "serve_itl_ms_p99"), None, False),
    ("output tok/s", ("serve_output_tokens_per_s",), None, True),
    ("goodput", ("serve_goodput_per_s",), None, True),
)
# what the gate (fail_on) may judge, by the name a command line gives it
GATES = {
    "time_per_token": "time/token",
    "prefill": "prefill",
    "ttft_p99": "TTFT p99",
    "itl_p99": "ITL p99",
    "output_tps": "output tok/s",
    "goodput": "goodput",
}


QUALITY = ("kl_mean", "perplexity", "divergent_share", "accuracy")


def identity(params: dict[str, str]) -> str:
    """A job's identity across sweeps: its config's params that say what ran, hashed. The dataset counts only
    where the job read it (a run recorded before a decode stopped recording the dataset it never read still
    matches one recorded after)."""
    kept = {k: v for k, v in params.items() if k.startswith(IDENTITY)}
    if not _read_dataset(params):
        kept = {k: v for k, v in kept.items() if not k.startswith("dataset.")}
    return hashlib.sha256(json.dumps(kept, sort_keys=True).encode()).hexdigest()[:16]


def _read_dataset(params: dict[str, str]) -> bool:
    """src.assembly.config.reads_dataset, from a run's params (values as strings; None as "None")."""

    def section(prefix: str) -> dict:
        return {
            k.removeprefix(prefix): None if v in ("None", "null") else v
            for k, v in params.items()
            if k.startswith(prefix) and "." not in k.removeprefix(prefix)
        }

    draft = {**section("draft."), "precision": section("draft.precision.") or None}
    raw = {"task": section("task."), "precision": section("precision."), "draft": draft, "engine": section("engine.")}
    raw["dataset"] = section("dataset.")
    return reads_dataset(raw)


@dataclass
class JobRuns:
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
    jobs: dict[str, JobRuns]
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
    jobs: dict[str, JobRuns] = {}
    host: dict[str, str] = {}
    for r in runs:
        record = JobRecord.of(r)
        key = identity(record.params)
        name = r.info.run_name.removesuffix(f" round {round_of(record)}")
        jobs.setdefault(key, JobRuns(name)).runs.append(record)
        for k, v in record.params.items():
            if k.startswith("host."):
                host.setdefault(k, v)
        for tag in ("git_commit", "cpu_model"):
            if tag in record.tags:
                host.setdefault(tag, record.tags[tag])
    return Sweep(parent.data.tags.get(SWEEP_ID, parent.info.run_id), parent.info.run_id, jobs, host)


def quiet_runs(job: JobRuns) -> list[JobRecord]:
    """The job's finished rounds timed on a quiet host; all of them where every round was busy."""
    return quiet(job.finished)


def per_round(job: JobRuns, summary: tuple[str, ...]) -> list[float]:
    """Each quiet round's figure: the first of `summary`'s metrics the run has."""
    found = []
    for r in quiet_runs(job):
        name = next((m for m in summary if m in r.metrics), None)
        if name is not None:
            found.append(r.metrics[name])
    return found


def per_example(client: MlflowClient, job: JobRuns, series: str | None) -> dict[int, float]:
    """Each example's figure (step = example number), the median over the job's quiet rounds."""
    values: dict[int, list[float]] = {}
    if series is None:
        return {}
    for run in quiet_runs(job):
        for m in client.get_metric_history(run.run_id, series):
            if not math.isnan(m.value):
                values.setdefault(m.step, []).append(m.value)
    return {step: statistics.median(v) for step, v in values.items()}


PAIRED_MIN = 3  # examples in both sweeps for the paired ratio; fewer: the rounds' figures, unpaired


def ratio_of(
    client: MlflowClient, old: JobRuns, new: JobRuns, summary: tuple[str, ...], series: str | None, confidence: float
):
    """(old, new, ratio, low, high, over): paired by example where both sweeps ran the same three or more
    examples (each example's new / old, each side the median of its rounds: the prompts' own spread
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
    old: float
    new: float
    ratio: float
    low: float
    high: float
    basis: str
    verdict: str
    higher_better: bool = False  # a throughput: worse ("slower") where it falls

    def worse_by(self, fraction: float) -> bool:
        """The whole interval past 1 by more than `fraction`, the worse way."""
        return self.high < 1 - fraction if self.higher_better else self.low > 1 + fraction


def verdict(low: float, high: float, tolerance: float = 0.0, higher_better: bool = False) -> str:
    """slower: the whole interval past 1 + tolerance the worse way (a time above, a throughput below 1 -
    tolerance); faster: past it the other way; else no change."""
    if math.isnan(low):
        return "no interval"
    if higher_better:
        low, high = 1 / high if high > 0 else math.inf, 1 / low if low > 0 else math.inf
    return "slower" if low > 1 + tolerance else "faster" if high < 1 - tolerance else "no change"


@dataclass
class Comparison:
    old: Sweep
    new: Sweep
    rows: list[Row]
    added: list[str]
    removed: list[str]
    failed: list[str]
    host_changes: list[tuple[str, str, str]]
    confidence: float
    tolerance: float = 0.0
    unjudged: list[str] = field(default_factory=list)  # what the gate could not judge, and why
    gate: str = "time/token"  # the figure the gate judges (GATES)

    def slower_than(self, fraction: float) -> list[Row]:
        return [r for r in self.rows if r.figure == self.gate and r.verdict == "slower" and r.worse_by(fraction)]


def compare(
    client: MlflowClient, base: Sweep, new: Sweep, confidence: float, tolerance: float = 0.03, gate: str = "time/token"
) -> Comparison:
    """Every matched job's figures and quality, new against old; what the gate (its figure, `gate`) could not
    judge, listed."""
    rows, unjudged = [], []
    for key in sorted(set(base.jobs) & set(new.jobs), key=lambda k: new.jobs[k].name):
        old_job, new_job = base.jobs[key], new.jobs[key]
        if not new_job.finished:
            unjudged.append(f"{new_job.name}: {new_job.outcome} in the new sweep")
            continue
        if not old_job.finished:
            continue  # the old sweep's failure is listed below; nothing to hold the new job to
        for figure, summary, series, higher in FIGURES:
            found = ratio_of(client, old_job, new_job, summary, series, confidence)
            if found is not None:
                a, b, ratio, low, high, over = found
                judged = verdict(low, high, tolerance, higher)
                rows.append(Row(new_job.name, figure, a, b, ratio, low, high, over, judged, higher))
                if figure == gate and math.isnan(low):
                    unjudged.append(
                        f"{new_job.name}: no interval for its {figure} ({over}); rounds=3 or more examples give one"
                    )
            elif figure == gate:
                unjudged.append(f"{new_job.name}: no {figure} on a side")
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
        for side, sweep in (("old", base), ("new", new))
        for j in sweep.jobs.values()
        if j.outcome in ("failed", "killed")
    )
    changes = [
        (k, base.host.get(k, "(not recorded)"), new.host.get(k, "(not recorded)"))
        for k in sorted(set(base.host) | set(new.host))
        if base.host.get(k) != new.host.get(k)
    ]
    unjudged += [f"{name}: not in the new sweep" for name in removed]
    if not any(r.figure == gate for r in rows):
        unjudged.insert(0, f"no job finished in both sweeps with a {gate}")
    return Comparison(base, new, rows, added, removed, failed, changes, confidence, tolerance, unjudged, gate)
