"""A sweep's report: rows read back (rows), tables (tables), plots (plots), report.md and its files
(markdown), the same attached to the sweep in MLflow (publish), and the command (cli: python -m src.report)."""

from src.common.settings import SettingError
from src.tracking.readback.reporting.cli import at_sweep_end, main, settings
from src.tracking.readback.reporting.markdown import build
from src.tracking.readback.reporting.publish import publish
from src.tracking.readback.reporting.rows import Report, job_rows
from src.tracking.readback.reporting.tables import busy_figure, describe

__all__ = [
    "Report",
    "SettingError",
    "at_sweep_end",
    "build",
    "busy_figure",
    "describe",
    "job_rows",
    "main",
    "publish",
    "settings",
]
