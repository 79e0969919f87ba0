"""What the report is made of: each job's measured rows read back, the summary's figures, and the lines said
above its tables (kernels that fell back, a draft's pass@1 beside its own completions without it).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path

from mlflow.tracking import MlflowClient

from src.common.metrics import EXAMPLE, LEGACY_EXAMPLE, ROW_METRICS, Row
from src.tracking.readback.compare import JobRounds, Speedup
from src.tracking.readback.sweeps import JobRecord

SUMMARY = (
    ("time_per_token_ms_median", "time/token (ms)"),
    ("prefill_ms_median", "prefill (ms)"),
    ("tokens_per_s_median", "tokens/s"),
    ("ttft_ms_p99", "TTFT p99 (ms)"),
    ("itl_ms_p50", "ITL p50 (ms)"),
    ("itl_ms_p90", "ITL p90 (ms)"),
    ("itl_ms_p99", "ITL p99 (ms)"),
    ("peak_rss_gb", "peak memory (GB)"),
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
    configs: list[JobRounds]  # the jobs across their rounds
    tables: dict[str, str]  # run name -> its seed table
    summary: list[list]  # one row per job
    speedups: list[Speedup]  # one per job with a baseline
    files: dict[str, Path]
    overview: str = ""  # the summary and speedup tables (the parent run's description)
    view_url: str = ""  # where the MLflow UI shows the sweep's jobs side by side (publish)
    flags: dict[str, str] = field(default_factory=dict)  # config key -> below quality.min_ratio, said
    points: list = field(default_factory=list)  # the speed–quality points (src.tracking.readback.speed_quality)


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


def _marked(name: str, said: str) -> str:
    """A job's name with its figure's condition before it, where there is one to say."""
    return f"[{said}] {name}" if said else name


def _sig3(value: float) -> float:
    """Three significant digits: what a timing on a shared host can tell (NaN stays NaN)."""
    return float(f"{value:.3g}")
