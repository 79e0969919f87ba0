"""One experiment in one tracking store, through MlflowClient rather than the fluent API (a sweep runs many
jobs in one process, and explicit run ids keep one job's logging from leaking into the next): its
sweeps' parent runs (found or created by sweep id, reopened when a sweep is rerun into the same
directory, closed with job counts read back from the store), its queries, and how a run ends. Opening
a store also replays what journals it is owed (src.tracking.store.replay) and ends what dead processes left
running (src.tracking.store.reaping)."""

from __future__ import annotations

import contextlib
import logging
import os
import sqlite3
import time
from pathlib import Path

import requests
from mlflow.entities import RunStatus, RunTag
from mlflow.exceptions import MlflowException
from mlflow.tracking import MlflowClient

from src.common import signals
from src.common.locks import file_lock
from src.tracking.store import journal, owner, reaping, replay
from src.tracking.store.blank import forget_engine, new_sqlite_store
from src.tracking.store.locks import sweep_lock
from src.tracking.store.names import (
    BATCH,
    HEARTBEAT,
    JOB_KEY,
    OUTCOME,
    OUTCOMES,
    OWNER,
    PROBE_TIMEOUT_S,
    PROBE_TRIES,
    REASON,
    ROLE,
    STATUS,
    SWEEP_ID,
    SWEEP_KEY,
    StoreUnreachable,
    artifact_location,
    bound_http_retries,
    first_line,
    key_of,
    latest_attempts,
)
from src.tracking.view import ui

log = logging.getLogger("quantspec")


def probe(uri: str) -> None:
    """Raise StoreUnreachable within a few seconds if a tracking server does not answer."""
    if not uri.startswith(("http://", "https://")):
        return
    problem = ""
    for attempt in range(PROBE_TRIES):
        try:
            if requests.get(f"{uri.rstrip('/')}/health", timeout=PROBE_TIMEOUT_S).ok:
                return
            problem = "it answered /health with an error"
        except requests.RequestException as err:
            problem = type(err).__name__
        if attempt + 1 < PROBE_TRIES:
            time.sleep(1)
    raise StoreUnreachable(
        f"tracking server {uri} does not answer ({problem}); start it (docs: how-to/lab.md, A tracking "
        f"server), or run with tracking.unreachable=journal to record locally and sync later"
    )


def _half_made(db: Path, err: Exception) -> bool:
    """Whether a SQLite store MLflow cannot open is one whose schema creation was cut short: its migration
    failed on a table that already exists, and it holds no runs (so nothing is lost by making it anew)."""
    if "already exists" not in str(err):
        return False
    try:
        with contextlib.closing(sqlite3.connect(f"file:{db}?mode=ro", uri=True)) as con:
            tables = {r[0] for r in con.execute("select name from sqlite_master where type = 'table'")}
            return "runs" not in tables or con.execute("select count(*) from runs").fetchone()[0] == 0
    except sqlite3.Error:
        return False


class Deferring:
    """An MlflowClient whose every call runs whole: a stop arriving inside one is raised when it returns
    (src.common.signals.deferred). Cut in the middle, a call had left SQLite's write lock held by a session that
    never ended, and the calls that close the runs then failed on "database is locked"."""

    def __init__(self, client: MlflowClient):
        self._client = client

    def __getattr__(self, name: str):
        found = getattr(self._client, name)
        if not callable(found):
            return found

        def call(*args, **kwargs):
            with signals.deferred():
                return found(*args, **kwargs)

        return call


class Store:
    """One experiment in one tracking store."""

    def __init__(self, uri: str, experiment: str):
        self.uri, self.experiment = uri, experiment
        if uri.startswith("sqlite:///"):
            # MLflow creates a new SQLite store's schema on first open; two first opens at once race.
            db = Path(uri.removeprefix("sqlite:///"))
            with file_lock(db.with_name(f".{db.name}.lock"), f"the tracking store {db.name}"):
                if not db.exists():
                    new_sqlite_store(db)
                try:
                    self.client = Deferring(MlflowClient(tracking_uri=uri))
                except Exception as err:  # noqa: BLE001 - a half-made schema is remade below; the rest is raised
                    if not _half_made(db, err):
                        raise
                    aside = db.with_name(f"{db.name}.half-made-{int(time.time())}")
                    forget_engine(uri)  # MLflow keeps one engine per address, still on the moved file
                    os.replace(db, aside)
                    log.warning(
                        "the tracking store %s was left half-made (its first creation killed mid-way) and "
                        "held no runs; moved to %s and made anew",
                        db,
                        aside.name,
                    )
                    new_sqlite_store(db)
                    self.client = Deferring(MlflowClient(tracking_uri=uri))
                self.experiment_id = self._experiment(experiment)
        else:
            self.client = Deferring(MlflowClient(tracking_uri=uri))
            self.experiment_id = self._experiment(experiment)

    def _experiment(self, name: str) -> str:
        found = self.client.get_experiment_by_name(name)
        if found is None:
            try:
                found = self.client.get_experiment(
                    self.client.create_experiment(name, artifact_location=artifact_location(self.uri))
                )
            except MlflowException:  # another process created it between our look and our create
                found = self.client.get_experiment_by_name(name)
        # How the experiment opens in the UI (its kind, its description): set by the first quantspec to
        # open it, and again when a newer quantspec says it differently.
        for key, value in ui.experiment_tags(found.experiment_id).items():
            if found.tags.get(key) != value:
                self.client.set_experiment_tag(found.experiment_id, key, value)
        return found.experiment_id

    def search(self, filter_string: str, **kwargs):
        return self.client.search_runs([self.experiment_id], filter_string=filter_string, **kwargs)

    # --- sweeps ------------------------------------------------------------------------------------

    def find_sweep(self, sweep_id: str):
        runs = self.search(f"tags.`{SWEEP_KEY}` = '{key_of(sweep_id)}' and tags.`{ROLE}` = 'sweep'", max_results=1)
        return runs[0] if runs else None

    def sweep_parent(self, sweep: dict, who: str | None = None) -> str:
        """The sweep's parent run, created on first use and owned by `who` (this process by default). This
        process's own job reopens and claims a parent it finds ended (a rerun); a replayed journal
        (`who`: its job's long-gone process) only finds it, so the reaper can still close it."""
        who = who or owner.me()
        # found or created under a lock per store and sweep: two processes (two syncs replaying one sweep's
        # journals, a sync beside the sweep) would otherwise both find none and make a parent each
        with sweep_lock(self.uri, sweep["id"]):
            found = self.find_sweep(sweep["id"])
            if found is None:
                return self.client.create_run(
                    self.experiment_id,
                    run_name=sweep["name"],
                    tags={
                        ROLE: "sweep",
                        SWEEP_ID: sweep["id"],
                        SWEEP_KEY: key_of(sweep["id"]),
                        "overrides": sweep["overrides"],
                        OWNER: who,
                        HEARTBEAT: str(journal.now_ms()),
                    },
                ).info.run_id
        run_id = found.info.run_id
        if who == owner.me() and (found.info.status != "RUNNING" or found.data.tags.get(OWNER) != who):
            self.client.update_run(run_id, status="RUNNING")
            self.set_tags(run_id, {OWNER: who, HEARTBEAT: str(journal.now_ms()), REASON: ""})
        return run_id

    def latest_jobs(self, parent_id: str) -> list:
        """The sweep's job runs, the latest attempt of each job only (a resumed sweep reruns some)."""
        return latest_attempts(self.search(f"tags.mlflow.parentRunId = '{parent_id}'", max_results=5000))

    def _attempt(self, sweep_id: str, job_key: str, status: str):
        """This sweep's attempt of a job with that status, if there is one."""
        parent = self.find_sweep(sweep_id)
        if parent is None:
            return None
        runs = self.search(
            f"tags.mlflow.parentRunId = '{parent.info.run_id}' and tags.`{JOB_KEY}` = '{job_key}' "
            f"and attributes.status = '{status}'",
            max_results=1,
        )
        return runs[0] if runs else None

    def busy_round(self, sweep_id: str, r: int) -> bool:
        """Whether a job of the sweep's round r (src.tracking.sweep.rounds) was timed on a busy host."""
        parent = self.find_sweep(sweep_id)
        return parent is not None and bool(
            self.search(
                f"tags.mlflow.parentRunId = '{parent.info.run_id}' and tags.`round` = '{r}' and tags.host_busy = 'true'",
                max_results=1,
            )
        )

    def finished_job(self, sweep_id: str, job_key: str):
        """The FINISHED run of this job under this sweep, if a previous attempt got that far."""
        return self._attempt(sweep_id, job_key, "FINISHED")

    def end_job(self, sweep_id: str, job_key: str, outcome: str, reason: str) -> bool:
        """End this sweep's RUNNING attempt of a job from outside it (its process or node is gone)."""
        run = self._attempt(sweep_id, job_key, "RUNNING")
        if run is not None:
            self.end_run(run.info.run_id, outcome, reason)
        return run is not None

    def end_run(self, run_id: str, outcome: str, reason: str, end_time: int | None = None) -> None:
        self.set_tags(run_id, {OUTCOME: outcome, REASON: reason})
        self.client.set_terminated(run_id, RunStatus.to_string(STATUS[outcome]), end_time=end_time)

    def close_sweep(self, parent_id: str, status: str = "FINISHED", reason: str | None = None) -> dict[str, int]:
        """End the parent with its counts as the store holds them (every job, whichever process ran it),
        and this close's reason (none clears an earlier one: a sweep reaped, then resumed and finished)."""
        jobs = self.latest_jobs(parent_id)
        counts = {o: sum(1 for r in jobs if r.data.tags.get(OUTCOME) == o) for o in OUTCOMES}
        counts["running"] = sum(1 for r in jobs if r.info.status == "RUNNING")
        self.set_tags(parent_id, {**{f"jobs_{o}": str(n) for o, n in counts.items()}, REASON: reason or ""})
        self.client.set_terminated(parent_id, status)
        return counts

    def set_tags(self, run_id: str, tags: dict[str, str]) -> None:
        items = [RunTag(k, str(v)) for k, v in tags.items()]
        for i in range(0, len(items), BATCH):
            self.client.log_batch(run_id, tags=items[i : i + BATCH])


def heartbeat(store: Store, run_ids: list[str]) -> None:
    """The runs' owner is alive: their heartbeat tags, now."""
    for run_id in run_ids:
        store.client.set_tag(run_id, HEARTBEAT, str(journal.now_ms()))


_opened: dict[tuple[str, str], Store] = {}


def open_store(uri: str, experiment: str, registry: Path, journal_if_unreachable: bool) -> Store | None:
    """The store, after replaying its pending journals and ending what dead processes left RUNNING.
    None when it cannot be reached and the job may journal instead; else StoreUnreachable, in seconds."""
    try:
        probe(uri)
        store = Store(uri, experiment)
    except Exception as err:  # noqa: BLE001 - MLflow, SQLAlchemy, the OS: whatever it is, one line
        # A store this process has already reached went away mid-sweep: the rest of the sweep journals.
        if journal_if_unreachable or any(u == uri for u, _ in _opened):
            log.warning("tracking store %s unreachable (%s); this job journals locally", uri, first_line(err))
            return None
        if isinstance(err, StoreUnreachable):
            raise
        raise StoreUnreachable(
            f"cannot open the tracking store {uri} ({first_line(err)}); fix or move it, or point "
            f"tracking.uri at another store"
        ) from None
    for line in replay.sync(store, registry):
        log.warning(line)
    if (uri, experiment) not in _opened:  # once per process: a sweep's later jobs need not look again
        for line in reaping.reap(store):
            log.warning(line)
    _opened[(uri, experiment)] = store
    return store


def store_problem(uri: str) -> str | None:
    """Why a command that reads a store cannot, in one line, or None: no SQLite store at that path (opening it
    would create an empty one), or a tracking server that does not answer within seconds (MLflow's own client
    would retry for minutes)."""
    if uri.startswith("sqlite:///"):
        path = Path(uri.removeprefix("sqlite:///"))
        if not path.is_file() or path.stat().st_size == 0:
            return f"no tracking store at {uri}; run a sweep first (python -m src.run -m ...)"
        with path.open("rb") as f:
            if f.read(16) != b"SQLite format 3\x00":
                return f"{path} is not a SQLite database, so not a tracking store; point tracking.uri= at one"
        try:  # MLflow checks the schema on open: one behind its own is refused with what to run
            MlflowClient(uri).search_experiments(max_results=1)
        except Exception as err:  # noqa: BLE001 - MLflow's, SQLAlchemy's, SQLite's: one line each
            return f"the tracking store {uri} cannot be read ({first_line(err)[:300]})"
    bound_http_retries()
    try:
        probe(uri)
    except StoreUnreachable as err:
        return f"{str(err).split(';')[0]}; start it, or point tracking.uri= at another store"
    return None
