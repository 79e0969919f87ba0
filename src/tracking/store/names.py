"""The names a tracking store's runs carry (a contract users query by: fixed) and the small helpers
every part of src.tracking shares: one-line errors, the default store, parameter flattening, keys."""

from __future__ import annotations

import hashlib
import logging
import os
from dataclasses import dataclass
from pathlib import Path

from mlflow.entities import RunStatus
from mlflow.exceptions import MlflowException
from sqlalchemy.exc import SQLAlchemyError

from src.common.environment import PROJECT_ROOT

ROLE, SWEEP_ID, SWEEP_KEY, JOB_KEY = "quantspec.role", "quantspec.sweep_id", "quantspec.sweep_key", "quantspec.job_key"
OWNER, HEARTBEAT, JOURNAL = "quantspec.owner", "quantspec.heartbeat", "quantspec.journal"
OUTCOME, REASON = "outcome", "outcome_reason"
CONFIG_KEY = "quantspec.config_key"  # a job's identity across a sweep's rounds (src.tracking.sweep.rounds)
CONFIG_HASH = "config_hash"  # a param: the digest of the job's resolved config (src.tracking.sweep.record.config_hash)
OUTCOMES = ("finished", "skipped", "failed", "killed")
STATUS = {
    "finished": RunStatus.FINISHED,
    "skipped": RunStatus.KILLED,
    "failed": RunStatus.FAILED,
    "killed": RunStatus.KILLED,
}
MAX_PARAM_CHARS = 6000  # MLflow's limit on a param value
BATCH = 100  # MLflow's limit on params (and tags) per log_batch call
PROBE_TRIES, PROBE_TIMEOUT_S = 3, 2.0
# Answers of a store that is up but refuses the request: recorded as refused in the journal (a replay
# would be refused again), never as delivered, and raised.
REFUSED = {"INVALID_PARAMETER_VALUE", "BAD_REQUEST", "INVALID_STATE"}
# The store no longer has the run (deleted, or a server restarted on a fresh backend): an outage for this
# job, whose journal replays it whole into a store that lacks it (src.tracking.store.journal.replay).
LOST = "RESOURCE_DOES_NOT_EXIST"


class StoreUnreachable(RuntimeError):
    """The tracking store cannot be reached; the message is the one line the user sees."""


def first_line(err: BaseException) -> str:
    """An exception in one short line: its type and its message's first line (MLflow and SQLAlchemy put
    the SQL, the parameters and a link after it)."""
    # SQLAlchemy opens some errors with advice about autoflush, its cause on the next line
    lines = [line for line in str(err).strip().splitlines() if not line.startswith("(raised as a result of")]
    first = lines[0].split(" with exception")[0] if lines else ""
    return f"{type(err).__name__}: {first}"[:200]


def default_uri() -> str:
    """The store where tracking.uri names none: MLflow's MLFLOW_TRACKING_URI where set, as
    every MLflow tool reads it, else the project's SQLite file."""
    return os.environ.get("MLFLOW_TRACKING_URI", "").strip() or f"sqlite:///{PROJECT_ROOT / 'mlflow.db'}"


def quiet_store_logs() -> None:
    """MLflow logs each database error with two full tracebacks (mlflow.store.db.utils) before raising it;
    every such failure is said here in one line (journaled, or refused), so its own log stays quiet. Its
    schema notes on a store's first use too."""
    logging.getLogger("mlflow.store.db.utils").setLevel(logging.CRITICAL)
    logging.getLogger("alembic").setLevel(logging.WARNING)


def bound_http_retries() -> None:
    """MLflow retries a lost server for minutes by default (7 retries, exponential backoff, 120 s
    timeouts); a job has measurements to journal, not minutes to wait. Users' own settings win."""
    for name, value in (
        ("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "2"),
        ("MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR", "1"),
        ("MLFLOW_HTTP_REQUEST_BACKOFF_JITTER", "0.2"),
        ("MLFLOW_HTTP_REQUEST_TIMEOUT", "5"),
    ):
        os.environ.setdefault(name, value)


def artifact_location(uri: str) -> str | None:
    """SQLite stores keep artifacts beside the database: never in whatever directory a job runs from."""
    if uri.startswith("sqlite:///"):
        return (Path(uri.removeprefix("sqlite:///")).parent / "mlartifacts").resolve().as_uri()
    return None  # a server decides where its artifacts go


def flatten(tree: dict, prefix: str = "") -> dict[str, str]:
    """Nested config to dot keys, the way the MLflow UI compares params."""
    flat: dict[str, str] = {}
    for key, value in tree.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict):
            flat.update(flatten(value, f"{name}."))
        else:
            flat[name] = str(value)[:MAX_PARAM_CHARS]
    return flat


def key_of(text: str) -> str:
    """A filter-safe key for a user string (a sweep directory may hold quotes; a hex digest never does)."""
    return hashlib.sha256(text.encode()).hexdigest()[:24]


def latest_attempts(runs: list) -> list:
    """One run per job, the latest attempt, in the order those ran (a resumed sweep reran some jobs)."""
    latest = {}
    for run in sorted(runs, key=lambda r: r.info.start_time):
        key = run.data.tags.get(JOB_KEY, run.info.run_id)
        latest.pop(key, None)
        latest[key] = run
    return list(latest.values())


@dataclass
class SweepInfo:
    sweep_id: str  # the sweep directory: unique per sweep, and the same for all its jobs
    name: str
    overrides: str

    def as_dict(self) -> dict:
        return {"id": self.sweep_id, "name": self.name, "overrides": self.overrides}


def refusal(err: Exception) -> str | None:
    """The reason a store that is up refused a record (MLflow's error code and first line), or None
    for any other failure."""
    if isinstance(err, MlflowException) and err.error_code in REFUSED and not _database_error(err):
        return f"{err.error_code}: {str(err).strip().splitlines()[0] if str(err).strip() else ''}"[:500]
    return None


def _database_error(err: MlflowException) -> bool:
    """MLflow answers a broken database (garbage over its file, a full or read-only disk) with BAD_REQUEST
    too; that is an outage to journal through, not a refusal of the record."""
    return isinstance(err.__cause__, SQLAlchemyError) or str(err).lstrip().startswith("(sqlite3.")


ROUND = "round"  # the job's round: a config key the sweeper sets, a tag and a param of each run


def config_key(override_dirname: str) -> str:
    """A job's identity across its rounds: its override_dirname without the `round=r` item."""
    return (
        ",".join(item for item in override_dirname.split(",") if not item.startswith(f"{ROUND}="))
        if override_dirname
        else ""
    )
