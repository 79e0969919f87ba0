"""Compare a sweep: the seed table of each job, a summary, speedups over a baseline, and plots.

    python -m src.report                          # the latest sweep in the default store
    python -m src.report sweep=/abs/multirun/... baseline.precision=bf16 tracking_uri=http://127.0.0.1:5000
    python -m src.report --help                   # this, and the settings; touches nothing

Reads the runs back from the tracking store (the report's numbers are the runs' own metrics), writes
report.md, summary.csv and PNG plots, and attaches them to the sweep's parent run so the MLflow UI
shows them beside the runs; rerun, it replaces the files and adds no metric points. Settings:
conf/report.yaml, overridable as key=value; a key it does not have is refused in one line.
"""

from __future__ import annotations

import math
import sys
from dataclasses import dataclass
from pathlib import Path

from mlflow.tracking import MlflowClient
from omegaconf import OmegaConf

from src import ui
from src.environment import PROJECT_ROOT
from src.metrics import ROW_METRICS, Row, markdown_table, seed_table
from src.paths import child
from src.record import TAG_GROUPS
from src.sweeps import JobRecord, sweep_jobs
from src.tracking import SWEEP_KEY, default_uri

KEY_GROUPS = ("model", "hardware", "precision", "draft", "task", "engine")
SUMMARY = (("prefill_ms_median", "prefill (ms)"), ("time_per_token_ms_median", "time/token (ms)"),
           ("tokens_per_s_median", "tokens/s"), ("perplexity", "perplexity"), ("pass_at_1", "pass@1"),
           ("decode_efficiency_median", "decode efficiency"), ("acceptance_rate_overall", "acceptance"),
           ("speedup_vs_no_draft_median", "speedup vs no draft (measured)"),
           ("expected_speedup", "expected speedup (Leviathan)"))


@dataclass
class Report:
    parent_run_id: str
    jobs: list[JobRecord]
    tables: dict[str, str]            # job name -> its seed table
    summary: list[list]               # one row per job
    speedups: list[list]              # one row per job with a baseline
    files: dict[str, Path]
    overview: str = ""                # the summary and speedup tables (the parent run's description)
    view_url: str = ""                # where the MLflow UI shows the sweep's jobs side by side (publish)


def job_rows(client: MlflowClient, job: JobRecord) -> list[Row]:
    """Per-example rows rebuilt from the run's metric histories (step = example number)."""
    history = {m: {p.step: p.value for p in client.get_metric_history(job.run_id, m)} for m in ROW_METRICS}
    steps = sorted(history["prompt_tokens"])
    get = lambda m, s: history[m].get(s, math.nan)  # noqa: E731 - NaN: never logged (one-token example)
    return [Row(s, int(get("prompt_tokens", s)), int(get("new_tokens", s)), get("total_time_s", s),
                get("prefill_ms", s), get("time_per_token_ms", s), get("tokens_per_s", s)) for s in steps]


def baseline_of(job: JobRecord, jobs: list[JobRecord], baseline: dict[str, str]) -> JobRecord | None:
    want = {g: baseline.get(g, job.choice(g)) for g in KEY_GROUPS}
    for other in jobs:
        if other.tags.get("outcome") == "finished" and all(other.choice(g) == v for g, v in want.items()):
            return other
    return None


def ratio(a: float | None, b: float | None) -> float:
    """a / b where both were measured, else NaN."""
    return a / b if a and b and not (math.isnan(a) or math.isnan(b)) else math.nan


def speedup_rows(jobs: list[JobRecord], baseline: dict[str, str]) -> list[list]:
    rows = []
    for job in jobs:
        base = baseline_of(job, jobs, baseline)
        if job.tags.get("outcome") != "finished" or base is None:
            continue
        m, b = job.metrics, base.metrics
        mark = lambda j: j.name + (" (FALLBACK)" if fallback(j) else "")  # noqa: E731
        rows.append([mark(job), mark(base),
                     ratio(b.get("time_per_token_ms_median"), m.get("time_per_token_ms_median")),
                     ratio(b.get("prefill_ms_median"), m.get("prefill_ms_median")),
                     ratio(m.get("perplexity"), b.get("perplexity"))])
    return rows


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
    return [f"**Kernels fell back**: {', '.join(j.name for j in fell)} ran on ATen's kernels because quantspec's "
            f"could not run here ({fell[0].tags.get('kernels_note', '?')}). Their times are ATen's, not their "
            f"precisions'; rows marked FALLBACK, and no headline metric uses them.\n"]


def draft_quality_lines(jobs: list[JobRecord]) -> list[str]:
    """For each job that coded with a draft: its pass@1 against the same completions made without it."""
    lines = []
    for job in jobs:
        m = job.metrics
        if "pass_at_1_no_draft" not in m or "pass_at_1" not in m:
            continue
        same = m.get("completions_identical_to_no_draft", math.nan)
        verdict = "equal" if m["pass_at_1"] == m["pass_at_1_no_draft"] else "different"
        lines.append(f"- {job.name}: pass@1 {m['pass_at_1']:.3f} with the draft, {m['pass_at_1_no_draft']:.3f} "
                     f"without ({verdict}; {same:.0%} of the completions identical)")
    return lines


def _by_job(plt, jobs: list[JobRecord], rows_of: dict[str, list[Row]], metric: str, label: str, out: Path):
    """Tasks whose prompts have no fixed lengths (decode, benchmark_code): each job's median over its
    examples, whiskers from its fastest to its slowest example. None where no such job has rows."""
    drawn = [(j.name, [getattr(r, metric) for r in rows_of.get(j.name) or []]) for j in jobs
             if j.choice("task") not in ("benchmark", "benchmark_long")]
    drawn = [(name, [v for v in values if not math.isnan(v)]) for name, values in drawn]
    drawn = [(name, sorted(values)) for name, values in drawn if values]
    if not drawn:
        return None
    fig, ax = plt.subplots(figsize=(7, 0.45 * len(drawn) + 1.5))
    medians = [v[len(v) // 2] for _, v in drawn]
    low = [m - v[0] for m, (_, v) in zip(medians, drawn)]
    high = [v[-1] - m for m, (_, v) in zip(medians, drawn)]
    ax.barh([name for name, _ in drawn], medians, xerr=[low, high], color="tab:blue", capsize=3)
    ax.set_xlabel(f"{label}: median over the examples, fastest to slowest")
    ax.set_title(f"{label} by job")
    ax.grid(True, axis="x", alpha=0.3)
    fig.tight_layout()
    path = out / f"{metric}_by_job.png"
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def _plots(client: MlflowClient, jobs: list[JobRecord], rows_of: dict[str, list[Row]], speedups: list[list],
           out: Path, base_text: str = "the baseline") -> dict[str, Path]:
    import matplotlib
    matplotlib.use("Agg")  # files only: no display on servers or in CI
    import matplotlib.pyplot as plt

    files = {}
    for metric, label in (("time_per_token_ms", "time/token (ms)"), ("prefill_ms", "prefill (ms)")):
        fig, ax = plt.subplots(figsize=(7, 4.5))
        drawn = 0
        for job in jobs:
            rows = rows_of.get(job.name) or []
            if len(rows) < 2 or job.choice("task") not in ("benchmark", "benchmark_long"):
                continue  # only fixed-length prompts make a curve against prompt length
            ax.plot([r.prompt_tokens for r in rows], [getattr(r, metric) for r in rows], marker="o",
                    label=f"{job.choice('precision')} · {job.choice('draft')} · {job.choice('hardware')}")
            drawn += 1
        if drawn:
            ax.set_xscale("log", base=2)
            ax.set_xlabel("prompt length (tokens)")
            ax.set_ylabel(label)
            ax.set_title(f"{label} against prompt length")
            ax.grid(True, alpha=0.3)
            ax.legend(fontsize=8)
            path = out / f"{metric}_vs_prompt.png"
            fig.tight_layout()
            fig.savefig(path, dpi=110)
            files[path.name] = path
        plt.close(fig)
        path = _by_job(plt, jobs, rows_of, metric, label, out)
        if path is not None:
            files[path.name] = path
    finite = [r for r in speedups if not math.isnan(r[2]) and r[0] != r[1]]  # not the baselines themselves
    if finite:
        fig, ax = plt.subplots(figsize=(7, 0.45 * len(finite) + 1.5))
        ax.barh([r[0] for r in finite], [r[2] for r in finite], color="tab:blue")
        ax.axvline(1.0, color="black", linewidth=0.8)
        ax.set_xlabel(f"time/token speedup over {base_text}")
        ax.set_title("speedup over the baseline: the job that differs only in " + ", ".join(
            sorted({k.split("=")[0] for k in base_text.split(", ")})) + " (same model, hardware, task, engine)",
            fontsize=9)
        for y, r in enumerate(finite):
            ax.text(r[2], y, f" {r[2]:.2f}×", va="center", fontsize=8)
        fig.tight_layout()
        path = out / "speedup.png"
        fig.savefig(path, dpi=110)
        files[path.name] = path
        plt.close(fig)
    return files


def save_markdown(name: str, text: str) -> Path:
    """A benchmark script's result, as reports/<name>.md under the project root (reports/ is not tracked)."""
    out = PROJECT_ROOT / "reports" / f"{name}.md"
    out.parent.mkdir(exist_ok=True)
    out.write_text(text)
    print(f"\nwritten to {out.relative_to(PROJECT_ROOT)}")
    return out


def _drop_empty(rows: list[list], headers: list[str]) -> tuple[list[list], list[str]]:
    """The summary without the metric columns no job has (all NaN: perplexity in a timing sweep)."""
    keep = [i for i, h in enumerate(headers) if i < 4 or any(
        not (isinstance(r[i], float) and math.isnan(r[i])) for r in rows)]
    return [[r[i] for i in keep] for r in rows], [headers[i] for i in keep]


def build(uri: str, experiment: str, sweep: str | None, baseline: dict[str, str], out_root: Path) -> Report:
    parent_id, jobs = sweep_jobs(uri, experiment, sweep)
    client = MlflowClient(uri)
    finished = [j for j in jobs if j.tags.get("outcome") == "finished"]
    rows_of = {j.name: job_rows(client, j) for j in finished}
    tables = {name: seed_table(rows) for name, rows in rows_of.items() if rows}
    summary = [[j.name, j.tags.get("outcome", "?"), j.tags.get("ran_on", "?"), kernels_of(j),
                *[j.metrics.get(k, math.nan) for k, _ in SUMMARY]] for j in jobs]
    speedups = speedup_rows(jobs, baseline)
    parent = client.get_run(parent_id)
    # a run name is anyone's string, and two sweep directories may share a base name: the sweep's key too
    out = child(out_root, f"{parent.info.run_name.replace(' ', '_')}-{parent.data.tags.get(SWEEP_KEY, parent_id)[:8]}")
    out.mkdir(parents=True, exist_ok=True)
    base_text = ", ".join(f"{k}={v}" for k, v in baseline.items())
    files = _plots(client, finished, rows_of, speedups, out, base_text)
    summary, headers = _drop_empty(summary, ["job", "outcome", "ran on", "kernels", *[h for _, h in SUMMARY]])
    parts = [f"# {parent.info.run_name}\n", f"`{parent.data.tags.get('overrides', '')}`\n",
             *fallback_lines(jobs),
             "## Summary\n", markdown_table(headers, summary) + "\n",
             f"## Speedup over the baseline ({base_text}; same model, hardware, task and engine)\n",
             (markdown_table(["job", "baseline", "time/token speedup", "prefill speedup", "perplexity ratio"],
                             speedups) if speedups else "(no job has its baseline in this sweep)") + "\n"]
    drafted = draft_quality_lines(jobs)
    if drafted:
        parts += ["## pass@1 with and without the draft\n", "\n".join(drafted) + "\n"]
    overview = "\n".join(parts[2:])
    parts += [f"![{name}]({name})\n" for name in files]
    for name, table in tables.items():
        parts += [f"## {name}\n", table + "\n"]
    (out / "report.md").write_text("\n".join(parts))
    (out / "summary.csv").write_text("\n".join(",".join(str(c) for c in row) for row in
                                               [headers, *summary]) + "\n")
    files.update({"report.md": out / "report.md", "summary.csv": out / "summary.csv"})
    return Report(parent_id, jobs, tables, summary, speedups, files, overview)


def publish(uri: str, experiment: str, sweep: str | None, baseline: dict[str, str], out_root: Path) -> Report:
    """build(), then put it where the MLflow UI shows it: the files under the parent run's `report/`,
    the comparison tables as the parent's description, and the sweep's headline metrics on the parent
    (so the top-level chart view compares sweeps; children keep every per-job metric)."""
    report = build(uri, experiment, sweep, baseline, out_root)
    client = MlflowClient(uri)
    for path in report.files.values():
        client.log_artifact(report.parent_run_id, str(path), "report")
    for job_name, base_name, time_speedup, *_ in report.speedups:   # a column of the sweep's view
        if not math.isnan(time_speedup):
            job = next(j for j in report.jobs if j.name == job_name.removesuffix(" (FALLBACK)"))
            _set_metric(client, job.run_id, "speedup_vs_baseline", time_speedup, job.metrics.get("speedup_vs_baseline"))
            job.metrics["speedup_vs_baseline"] = time_speedup
    parent = client.get_run(report.parent_run_id)
    held, key = parent.data.metrics, parent.data.tags.get(SWEEP_KEY, report.parent_run_id)
    report.view_url = ui.publish_view(client, parent.info.experiment_id, report.parent_run_id, key, report.jobs)
    # relative: the link holds on whatever host and port serve the UI
    client.set_tag(report.parent_run_id, "mlflow.note.content",
                   f"[The sweep's jobs side by side]({ui.view_path(parent.info.experiment_id, key)})\n\n{report.overview}")
    timed = [j for j in report.jobs if j.tags.get("outcome") == "finished" and j.metrics.get("time_per_token_ms_median")
             and not fallback(j)]
    if timed:
        best = min(timed, key=lambda j: j.metrics["time_per_token_ms_median"])
        _set_metric(client, report.parent_run_id, "best_time_per_token_ms", best.metrics["time_per_token_ms_median"],
                    held.get("best_time_per_token_ms"))
        client.set_tag(report.parent_run_id, "best_time_per_token_job", best.name)
    gains = [r for r in report.speedups if r[0] != r[1] and not math.isnan(r[2]) and "(FALLBACK)" not in r[0] + r[1]]
    if gains:
        top = max(gains, key=lambda r: r[2])
        _set_metric(client, report.parent_run_id, "best_speedup", top[2], held.get("best_speedup"))
        client.set_tag(report.parent_run_id, "best_speedup_job", top[0])
    return report


SETTINGS = PROJECT_ROOT / "conf" / "report.yaml"
BASELINE_KEYS = (*TAG_GROUPS, "engine")   # the choices a job is tagged with


class SettingError(ValueError):
    """A report setting that is not one; the message is the one line the user sees."""


def settings(argv: list[str] = ()):
    """conf/report.yaml under key=value overrides; a key it does not have is refused, naming those it has."""
    base = OmegaConf.load(SETTINGS)
    for arg in argv:
        key, eq, _ = arg.partition("=")
        top, _, sub = key.partition(".")
        if not eq or not key:
            raise SettingError(f"{arg!r} is not key=value; settings: {', '.join(base)} (python -m src.report --help)")
        if top not in base or (top == "baseline" and sub not in BASELINE_KEYS) or (top != "baseline" and sub):
            raise SettingError(f"{key} is not a report setting; settings: {', '.join(base)}, and baseline.<"
                               f"{'|'.join(BASELINE_KEYS)}> (python -m src.report --help)")
    return OmegaConf.merge(base, OmegaConf.from_dotlist(list(argv)))


def usage() -> str:
    """This module's docstring and its settings with their defaults and comments (conf/report.yaml)."""
    return f"{__doc__.strip()}\n\nSettings (conf/report.yaml):\n\n" + "\n".join(
        f"    {line}" for line in SETTINGS.read_text().splitlines() if line.strip() and not line.startswith("#"))


def _set_metric(client: MlflowClient, run_id: str, key: str, value: float, current: float | None) -> None:
    """Log a metric unless the run holds that value already: rerunning the report adds no points."""
    if current is None or not math.isclose(current, value, rel_tol=1e-9, abs_tol=0.0):
        client.log_metric(run_id, key, value)


def at_sweep_end(uri: str, experiment: str, sweep_id: str) -> None:
    """A sweep's report, made and attached when it ends (report_at_end), with conf/report.yaml's baseline."""
    cfg = settings()
    try:
        report = publish(uri, experiment, sweep_id, dict(cfg.baseline), PROJECT_ROOT / cfg.out)
        print(f"quantspec: compare the sweep in the MLflow UI: {report.view_url}"
              + ("" if uri.startswith("http") else f" (after: mlflow ui --backend-store-uri {uri})"), flush=True)
    except Exception as err:  # noqa: BLE001 - the runs are recorded; `python -m src.report` can redo this
        print(f"quantspec: the sweep's report was not made ({type(err).__name__}: {str(err).splitlines()[0][:120]}); "
              f"run python -m src.report", file=sys.stderr)


def main(argv: list[str]) -> int:
    if {"-h", "--help"} & set(argv):
        print(usage())
        return 0
    try:
        cfg = settings(argv)
    except SettingError as err:
        print(f"quantspec: {err}", file=sys.stderr)
        return 2
    uri = cfg.tracking_uri or default_uri()
    if uri.startswith("sqlite:///") and not Path(uri.removeprefix("sqlite:///")).is_file():
        # opening would create an empty database: say what is missing instead
        print(f"quantspec: no tracking store at {uri}; run a sweep first (python -m src.run -m ...)", file=sys.stderr)
        return 2
    try:
        sweep = str(Path(cfg.sweep).resolve()) if cfg.sweep else None  # sweeps are keyed by absolute directory
        report = (publish if cfg.attach else build)(uri, cfg.experiment, sweep, dict(cfg.baseline),
                                                    PROJECT_ROOT / cfg.out)
    except LookupError as err:
        print(f"quantspec: {err}", file=sys.stderr)
        return 2
    print((report.files["report.md"]).read_text())
    print(f"written to {report.files['report.md'].parent}"
          + (f" and attached to the sweep's parent run; compare in the MLflow UI: {report.view_url}" if cfg.attach else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
