"""A job built in process as a sweep builds it (src.assembly.job.build), for the scripts that time its parts."""

from __future__ import annotations

from src.assembly.composed import job_config
from src.assembly.job import Job, build
from src.common.schema import ConfigError


def build_job(precision: str, *overrides: str) -> Job:
    """The job a sweep at this precision builds (src.assembly.job.build), here in process to time its parts."""
    try:
        cfg = job_config([f"precision={precision}", *overrides])
    except ConfigError as e:
        raise SystemExit(f"quantspec: {e}") from None
    return build(cfg)
