"""The report as one JSON document (`python -m src.report format=json`, and report.json beside report.md): every
job of the sweep with what ran and each summary figure over its rounds, and each speedup over its baseline.
The document's schema is docs/reference/report-json.md's (format `quantspec.sweep/1`); a figure that was not
measured (NaN) is null.

A figure over rounds is the report's own: the median over the job's quiet rounds (all, marked, where every
round was busy), with its lowest and highest round and how many rounds it stands on.
"""

from __future__ import annotations

import json

from src.common.axes import AXES
from src.common.jsonable import jsonable
from src.tracking.readback.compare import Spread
from src.tracking.readback.reporting.rows import Report, kernels_of

FORMAT = "quantspec.sweep/1"


def _spread(s: Spread) -> dict:
    return {
        "median": s.median,
        "low": s.low,
        "high": s.high,
        "rounds": s.used,
        "busy_rounds_left_out": s.excluded,
        "all_busy": s.all_busy,
    }


def _figures(config) -> dict[str, dict]:
    """Each summary figure a finished round of the job logged (not per-example series, not system metrics)."""
    names = sorted({m for run in config.finished().values() for m in run.metrics if "/" not in m})
    return {name: _spread(config.spread(name)) for name in names}


def document(report: Report, baseline: dict[str, str]) -> dict:
    jobs = [
        {
            "name": c.name,
            "outcome": c.outcome,
            "choices": {group: c.choice(group) for group in AXES},
            "ran_on": c.shown.tags.get("ran_on"),
            "kernels": kernels_of(c.shown),
            "rounds": len(c.runs),
            "busy_rounds": c.busy_rounds(),
            "run_ids": [run.run_id for run in c.runs],
            "quality_flag": report.flags.get(c.key) or None,
            "figures": _figures(c),
        }
        for c in report.configs
    ]
    speedups = [
        {
            "job": u.job.name,
            "baseline": u.base.name,
            "is_baseline": u.is_baseline,
            "time_per_token": _spread(u.time),
            "prefill": _spread(u.prefill),
        }
        for u in report.speedups
    ]
    return jsonable(
        {
            "format": FORMAT,
            "sweep": {"parent_run_id": report.parent_run_id},
            "baseline": baseline,
            "jobs": jobs,
            "speedups": speedups,
        }
    )


def text(report: Report, baseline: dict[str, str]) -> str:
    return json.dumps(document(report, baseline), indent=2, sort_keys=True) + "\n"
