"""Compare a sweep: the seed table of each job, a summary, speedups over a baseline, plots, and where the
sweep measured quality, the quality table, the speed–quality front and paired comparisons
(src.tracking.readback.speed_quality).

    python -m src.report                          # the latest sweep in the default store
    python -m src.report sweep=/abs/multirun/... baseline.precision=bf16 tracking.uri=http://127.0.0.1:5000
    python -m src.report quality.metric=accuracy quality.min_ratio=0.98
    python -m src.report format=json              # the same as one JSON document (docs: reference/report-json.md)
    python -m src.report --help                   # this, and the settings; touches nothing

Reads the runs back from the tracking store (the report's numbers are the runs' own metrics), writes
report.md, report.json, summary.csv and PNG plots, and attaches them to the sweep's parent run so the MLflow UI
shows them beside the runs; rerun, it replaces the files and adds no metric points. Settings:
key=value, listed with their defaults by --help; a key it does not have is refused in one line.
"""

from __future__ import annotations

import sys
from pathlib import Path

from src.common.environment import PROJECT_ROOT
from src.common.say import message_line, say
from src.tracking.readback.command import start
from src.tracking.readback.reporting.markdown import build
from src.tracking.readback.reporting.publish import publish, ui_line
from src.tracking.readback.reporting.settings import command, settings


def usage() -> str:
    return command(__doc__).usage()


def at_sweep_end(uri: str, experiment: str, sweep_id: str) -> None:
    """A sweep's report, made and attached when it ends (report_at_end), with the settings' defaults."""
    cfg = settings()
    try:
        report = publish(uri, experiment, sweep_id, cfg["baseline"], PROJECT_ROOT / cfg["out"], cfg["quality"])
        say(f"compare the sweep in the MLflow UI: {ui_line(uri, report.view_url)}")
    except Exception as err:  # noqa: BLE001 - the runs are recorded; `python -m src.report` can redo this
        say(
            f"the sweep's report was not made ({type(err).__name__}: {message_line(err)[:120]}); "
            f"run python -m src.report",
            err=True,
        )


def main(argv: list[str]) -> int:
    started = start(argv, usage, settings)
    if isinstance(started, int):
        return started
    cfg, uri = started
    try:
        sweep = str(Path(cfg["sweep"]).resolve()) if cfg["sweep"] else None  # sweeps are keyed by absolute directory
        report = (publish if cfg["attach"] else build)(
            uri, cfg["experiment"], sweep, cfg["baseline"], PROJECT_ROOT / cfg["out"], cfg["quality"]
        )
    except LookupError as err:
        say(str(err), err=True)
        return 2
    printed = "report.json" if cfg["format"] == "json" else "report.md"
    print(report.files[printed].read_text(), end="" if printed == "report.json" else "\n")
    print(  # beside JSON, on stderr: what is printed on stdout stays one document a program can read
        f"written to {report.files['report.md'].parent}"
        + (
            f" and attached to the sweep's parent run; compare in the MLflow UI: {ui_line(uri, report.view_url)}"
            if cfg["attach"]
            else ""
        ),
        file=sys.stderr if printed == "report.json" else sys.stdout,
    )
    return 0
