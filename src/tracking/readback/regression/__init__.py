"""A sweep against an older one: jobs matched and judged (judge), the comparison written out (page), and
the command (cli: python -m src.regress)."""

from src.common.settings import SettingError
from src.tracking.readback.regression.cli import COMMAND, main, settings, usage
from src.tracking.readback.regression.judge import (
    GATES,
    Comparison,
    JobRuns,
    Row,
    Sweep,
    compare,
    identity,
    load,
    verdict,
)
from src.tracking.readback.regression.page import markdown, plot, write

__all__ = [
    "COMMAND",
    "GATES",
    "Comparison",
    "JobRuns",
    "Row",
    "SettingError",
    "Sweep",
    "compare",
    "identity",
    "load",
    "main",
    "markdown",
    "plot",
    "settings",
    "usage",
    "verdict",
    "write",
]
