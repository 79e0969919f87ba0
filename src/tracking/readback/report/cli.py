"""Compare a sweep: the seed table of each job, a summary, speedups over a baseline, plots, and where the
sweep measured quality, the quality table, the speed–quality front and paired comparisons
(src.tracking.readback.quality).

    python -m src.report                          # the latest sweep in the default store
    python -m src.report sweep=/abs/multirun/... baseline.precision=bf16 tracking_uri=http://127.0.0.1:5000
    python -m src.report quality.metric=accuracy quality.min_ratio=0.98
    python -m src.report --help                   # this, and the settings; touches nothing

Reads the runs back from the tracking store (the report's numbers are the runs' own metrics), writes
report.md, summary.csv and PNG plots, and attaches them to the sweep's parent run so the MLflow UI
shows them beside the runs; rerun, it replaces the files and adds no metric points. Settings:
key=value, listed with their defaults by --help; a key it does not have is refused in one line.
"""

from __future__ import annotations

import sys
from pathlib import Path

from src.common import envvars
from src.common.environment import PROJECT_ROOT
from src.common.settings import SettingError
from src.tracking.readback.report.markdown import build
from src.tracking.readback.report.publish import publish, ui_line
from src.tracking.readback.report.settings import command, settings
from src.tracking.store.experiment import store_problem
from src.tracking.store.names import (
    default_uri,
)


def usage() -> str:
    return command(__doc__).usage()


def at_sweep_end(uri: str, experiment: str, sweep_id: str) -> None:
    """A sweep's report, made and attached when it ends (report_at_end), with the settings' defaults."""
    cfg = settings()
    try:
        report = publish(uri, experiment, sweep_id, cfg["baseline"], PROJECT_ROOT / cfg["out"], cfg["quality"])
        print(f"quantspec: compare the sweep in the MLflow UI: {ui_line(uri, report.view_url)}", flush=True)
    except Exception as err:  # noqa: BLE001 - the runs are recorded; `python -m src.report` can redo this
        print(
            f"quantspec: the sweep's report was not made ({type(err).__name__}: {str(err).splitlines()[0][:120]}); "
            f"run python -m src.report",
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
    uri = cfg["tracking_uri"] or default_uri()
    if (line := store_problem(uri)) is not None:
        print(f"quantspec: {line}", file=sys.stderr)
        return 2
    try:
        sweep = str(Path(cfg["sweep"]).resolve()) if cfg["sweep"] else None  # sweeps are keyed by absolute directory
        report = (publish if cfg["attach"] else build)(
            uri, cfg["experiment"], sweep, cfg["baseline"], PROJECT_ROOT / cfg["out"], cfg["quality"]
        )
    except LookupError as err:
        print(f"quantspec: {err}", file=sys.stderr)
        return 2
    print((report.files["report.md"]).read_text())
    print(
        f"written to {report.files['report.md'].parent}"
        + (
            f" and attached to the sweep's parent run; compare in the MLflow UI: {ui_line(uri, report.view_url)}"
            if cfg["attach"]
            else ""
        )
    )
    return 0
