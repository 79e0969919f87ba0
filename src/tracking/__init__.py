"""A job's lifecycle and its records in MLflow: one parent run per sweep, one child run per job per round,
and how each ends.

- names: the tags and metrics runs carry (a contract users query by) and small shared helpers;
- store: one experiment in one store: its sweeps' parent runs, queries, ending runs; opening one;
- jobrun: one job's run: every record journaled first (journal), then sent while the store answers;
- replay, reaping, sync: journals carried into a store later; runs dead processes left RUNNING (owner);
- record: a job run end to end with its outcome; signals: SIGTERM/SIGINT as a killed job;
- sweeps, rounds, compare, report, ui: a sweep's jobs read back, its rounds and speedups, its report
  and its MLflow view; sysmetrics and progress: what the host did while a job was timed.
"""

from src.tracking.jobrun import JobRun
from src.tracking.names import (
    CONFIG_HASH,
    CONFIG_KEY,
    HEARTBEAT,
    JOB_KEY,
    JOURNAL,
    OUTCOME,
    OUTCOMES,
    OWNER,
    REASON,
    ROLE,
    SWEEP_ID,
    SWEEP_KEY,
    StoreUnreachable,
    SweepInfo,
    bound_http_retries,
    default_uri,
    first_line,
    flatten,
    key_of,
    latest_attempts,
    quiet_store_logs,
    refusal,
)
from src.tracking.store import Store, open_store, probe

__all__ = [
    "CONFIG_HASH",
    "CONFIG_KEY",
    "HEARTBEAT",
    "JOB_KEY",
    "JOURNAL",
    "OUTCOME",
    "OUTCOMES",
    "OWNER",
    "REASON",
    "ROLE",
    "SWEEP_ID",
    "SWEEP_KEY",
    "JobRun",
    "Store",
    "StoreUnreachable",
    "SweepInfo",
    "bound_http_retries",
    "default_uri",
    "first_line",
    "flatten",
    "key_of",
    "latest_attempts",
    "open_store",
    "probe",
    "quiet_store_logs",
    "refusal",
]
