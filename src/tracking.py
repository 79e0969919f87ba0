"""The MLflow run lifecycle: one parent run per sweep, one child run per job, and how each ends.

Through MlflowClient rather than the fluent API: a sweep runs many jobs in one process, and explicit
run ids keep one job's logging from leaking into the next. What this adds over MLflow itself:
- a sweep's parent is found or created by its sweep id (any launcher works), reopened when a sweep
  is rerun into the same directory, and closed with its job counts read back from the store;
- a job ends as finished, skipped, failed or killed, with its reason;
- every record a job sends goes first to its local journal (src.journal): a store that fails
  mid-job costs nothing measured, and the job goes on;
- runs record their owner and a heartbeat, and a run left RUNNING by a process that is gone is ended
  as interrupted by the next process that opens the store (src.owner).
"""

from __future__ import annotations

import hashlib
import logging
import math
import os
import threading
import time
import traceback
from dataclasses import dataclass
from pathlib import Path

from mlflow.entities import Dataset, DatasetInput, InputTag, Metric, Param, RunStatus, RunTag
from mlflow.exceptions import MlflowException
from mlflow.tracking import MlflowClient

from src import journal, owner, ui
from src.environment import PROJECT_ROOT
from src.locks import file_lock

log = logging.getLogger("quantspec")

# Tag and metric names are a contract users query by: fixed.
ROLE, SWEEP_ID, SWEEP_KEY, JOB_KEY = "quantspec.role", "quantspec.sweep_id", "quantspec.sweep_key", "quantspec.job_key"
OWNER, HEARTBEAT, JOURNAL = "quantspec.owner", "quantspec.heartbeat", "quantspec.journal"
OUTCOME, REASON = "outcome", "outcome_reason"
CONFIG_KEY = "quantspec.config_key"   # a job's identity across a sweep's rounds (src.rounds)
CONFIG_HASH = "config_hash"   # a param: the digest of the job's resolved config (src.record.config_hash)
OUTCOMES = ("finished", "skipped", "failed", "killed")
STATUS = {"finished": RunStatus.FINISHED, "skipped": RunStatus.KILLED, "failed": RunStatus.FAILED,
          "killed": RunStatus.KILLED}
MAX_PARAM_CHARS = 6000      # MLflow's limit on a param value
BATCH = 100                 # MLflow's limit on params (and tags) per log_batch call
PROBE_TRIES, PROBE_TIMEOUT_S = 3, 2.0
# Answers of a store that is up but refuses the request: recorded as refused in the journal (a replay
# would be refused again), never as delivered, and raised.
REFUSED = {"INVALID_PARAMETER_VALUE", "BAD_REQUEST", "INVALID_STATE"}
# The store no longer has the run (deleted, or a server restarted on a fresh backend): an outage for this
# job, whose journal replays it whole into a store that lacks it (src.journal.replay).
LOST = "RESOURCE_DOES_NOT_EXIST"


class StoreUnreachable(RuntimeError):
    """The tracking store cannot be reached; the message is the one line the user sees."""


def first_line(err: BaseException) -> str:
    """An exception in one short line: its type and its message's first line (MLflow and SQLAlchemy put
    the SQL, the parameters and a link after it)."""
    text = str(err).strip()
    first = text.splitlines()[0].split(" with exception")[0] if text else ""
    return f"{type(err).__name__}: {first}"[:200]


def default_uri() -> str:
    return f"sqlite:///{PROJECT_ROOT / 'mlflow.db'}"


def quiet_store_logs() -> None:
    """MLflow logs each database error with two full tracebacks (mlflow.store.db.utils) before raising it;
    every such failure is said here in one line (journaled, or refused), so its own log stays quiet. Its
    schema notes on a store's first use too."""
    import logging as logging_
    logging_.getLogger("mlflow.store.db.utils").setLevel(logging_.CRITICAL)
    logging_.getLogger("alembic").setLevel(logging_.WARNING)


def bound_http_retries() -> None:
    """MLflow retries a lost server for minutes by default (7 retries, exponential backoff, 120 s
    timeouts); a job has measurements to journal, not minutes to wait. Users' own settings win."""
    for name, value in (("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "2"), ("MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR", "1"),
                        ("MLFLOW_HTTP_REQUEST_BACKOFF_JITTER", "0.2"), ("MLFLOW_HTTP_REQUEST_TIMEOUT", "5")):
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
    sweep_id: str        # the sweep directory: unique per sweep, and the same for all its jobs
    name: str
    overrides: str

    def as_dict(self) -> dict:
        return {"id": self.sweep_id, "name": self.name, "overrides": self.overrides}


def probe(uri: str) -> None:
    """Raise StoreUnreachable within a few seconds if a tracking server does not answer."""
    if not uri.startswith(("http://", "https://")):
        return
    import requests
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
    raise StoreUnreachable(f"tracking server {uri} does not answer ({problem}); start it (README: A tracking "
                           f"server), or run with tracking.unreachable=journal to record locally and sync later")


class Store:
    """One experiment in one tracking store."""

    def __init__(self, uri: str, experiment: str):
        self.uri, self.experiment = uri, experiment
        if uri.startswith("sqlite:///"):
            # MLflow creates a new SQLite store's schema on first open; two first opens at once race.
            db = Path(uri.removeprefix("sqlite:///"))
            with file_lock(db.with_name(f".{db.name}.lock"), f"the tracking store {db.name}"):
                self.client = MlflowClient(tracking_uri=uri)
                self.experiment_id = self._experiment(experiment)
        else:
            self.client = MlflowClient(tracking_uri=uri)
            self.experiment_id = self._experiment(experiment)

    def _experiment(self, name: str) -> str:
        found = self.client.get_experiment_by_name(name)
        if found is None:
            try:
                found = self.client.get_experiment(self.client.create_experiment(
                    name, artifact_location=artifact_location(self.uri)))
            except MlflowException:  # another process created it between our look and our create
                found = self.client.get_experiment_by_name(name)
        # How the experiment opens in the UI (its kind, its description): set by the first quantspec to
        # open it, and again when a newer quantspec says it differently.
        for key, value in ui.experiment_tags(found.experiment_id).items():
            if found.tags.get(key) != value:
                self.client.set_experiment_tag(found.experiment_id, key, value)
        return found.experiment_id

    def _search(self, filter_string: str, **kwargs):
        return self.client.search_runs([self.experiment_id], filter_string=filter_string, **kwargs)

    # --- sweeps ------------------------------------------------------------------------------------

    def find_sweep(self, sweep_id: str):
        runs = self._search(f"tags.`{SWEEP_KEY}` = '{key_of(sweep_id)}' and tags.`{ROLE}` = 'sweep'", max_results=1)
        return runs[0] if runs else None

    def sweep_parent(self, sweep: dict, who: str | None = None) -> str:
        """The sweep's parent run, created on first use and owned by `who` (this process by default). This
        process's own job reopens and claims a parent it finds ended (a rerun); a replayed journal
        (`who`: its job's long-gone process) only finds it, so the reaper can still close it."""
        found = self.find_sweep(sweep["id"])
        who = who or owner.me()
        if found is None:
            return self.client.create_run(self.experiment_id, run_name=sweep["name"], tags={
                ROLE: "sweep", SWEEP_ID: sweep["id"], SWEEP_KEY: key_of(sweep["id"]), "overrides": sweep["overrides"],
                OWNER: who, HEARTBEAT: str(journal.now_ms())}).info.run_id
        run_id = found.info.run_id
        if who == owner.me() and (found.info.status != "RUNNING" or found.data.tags.get(OWNER) != who):
            self.client.update_run(run_id, status="RUNNING")
            self._tags(run_id, {OWNER: who, HEARTBEAT: str(journal.now_ms()), REASON: ""})
        return run_id

    def latest_jobs(self, parent_id: str) -> list:
        """The sweep's job runs, the latest attempt of each job only (a resumed sweep reruns some)."""
        return latest_attempts(self._search(f"tags.mlflow.parentRunId = '{parent_id}'", max_results=5000))

    def _attempt(self, sweep_id: str, job_key: str, status: str):
        """This sweep's attempt of a job with that status, if there is one."""
        parent = self.find_sweep(sweep_id)
        if parent is None:
            return None
        runs = self._search(f"tags.mlflow.parentRunId = '{parent.info.run_id}' and tags.`{JOB_KEY}` = '{job_key}' "
                            f"and attributes.status = '{status}'", max_results=1)
        return runs[0] if runs else None

    def busy_round(self, sweep_id: str, r: int) -> bool:
        """Whether a job of the sweep's round r (src.rounds) was timed on a busy host."""
        parent = self.find_sweep(sweep_id)
        return parent is not None and bool(self._search(
            f"tags.mlflow.parentRunId = '{parent.info.run_id}' and tags.`round` = '{r}' and tags.host_busy = 'true'",
            max_results=1))

    def finished_job(self, sweep_id: str, job_key: str):
        """The FINISHED run of this job under this sweep, if a previous attempt got that far."""
        return self._attempt(sweep_id, job_key, "FINISHED")

    def end_job(self, sweep_id: str, job_key: str, outcome: str, reason: str) -> bool:
        """End this sweep's RUNNING attempt of a job from outside it (its process or node is gone)."""
        run = self._attempt(sweep_id, job_key, "RUNNING")
        if run is not None:
            self._end_run(run.info.run_id, outcome, reason)
        return run is not None

    def _end_run(self, run_id: str, outcome: str, reason: str, end_time: int | None = None) -> None:
        self._tags(run_id, {OUTCOME: outcome, REASON: reason})
        self.client.set_terminated(run_id, RunStatus.to_string(STATUS[outcome]), end_time=end_time)

    def close_sweep(self, parent_id: str, status: str = "FINISHED", reason: str | None = None) -> dict[str, int]:
        """End the parent with its counts as the store holds them (every job, whichever process ran it),
        and this close's reason (none clears an earlier one: a sweep reaped, then resumed and finished)."""
        jobs = self.latest_jobs(parent_id)
        counts = {o: sum(1 for r in jobs if r.data.tags.get(OUTCOME) == o) for o in OUTCOMES}
        counts["running"] = sum(1 for r in jobs if r.info.status == "RUNNING")
        self._tags(parent_id, {**{f"jobs_{o}": str(n) for o, n in counts.items()}, REASON: reason or ""})
        self.client.set_terminated(parent_id, status)
        return counts

    # --- records (the journal's ops) ---------------------------------------------------------------

    def _tags(self, run_id: str, tags: dict[str, str]) -> None:
        items = [RunTag(k, str(v)) for k, v in tags.items()]
        for i in range(0, len(items), BATCH):
            self.client.log_batch(run_id, tags=items[i:i + BATCH])

    def apply(self, record: dict, run_id: str | None) -> str:
        """Carry out one journal record; returns the run's id (a start creates it)."""
        op = record["op"]
        if op == "start":
            found = self._search(f"tags.`{JOURNAL}` = '{record['journal']}'", max_results=1)
            if found:  # a replay after a crash between create and ack: the run exists already
                return found[0].info.run_id
            tags = {**record["tags"], JOURNAL: record["journal"]}
            if record.get("sweep"):
                tags["mlflow.parentRunId"] = self.sweep_parent(record["sweep"], record["tags"].get(OWNER))
            run_id = self.client.create_run(self.experiment_id, run_name=record["name"], start_time=record["time"],
                                            tags=tags).info.run_id
            op = "params"
        if run_id is None:
            raise ValueError(f"journal record {record['seq']} ({op}) has no run")
        if op == "params":
            items = [Param(k, v) for k, v in record["params"].items()]
            for i in range(0, len(items), BATCH):
                self.client.log_batch(run_id, params=items[i:i + BATCH])
        elif op == "tags":
            self._tags(run_id, record["tags"])
        elif op == "metrics":
            metrics = [Metric(k, v, t, s) for k, v, t, s in record["metrics"]]
            for i in range(0, len(metrics), 1000):
                self.client.log_batch(run_id, metrics=metrics[i:i + 1000])
        elif op == "text":
            self.client.log_text(run_id, record["text"], record["name"])
        elif op == "input":  # MLflow's dataset input: the UI's Dataset column and filter
            used = [DatasetInput(Dataset(**record["dataset"]), [InputTag("mlflow.data.context", record["context"])])]
            try:
                self.client.log_inputs(run_id, used)
            except MlflowException as err:
                # Two jobs recording the same new dataset at once: MLflow creates it in one and refuses the
                # other's create (a unique key); the second try finds it and links it.
                if "UNIQUE" not in str(err) and "unique" not in str(err):
                    raise
                self.client.log_inputs(run_id, used)
        elif op == "end":
            self._end_run(run_id, record["outcome"], record.get("reason") or "", record["time"])
        return run_id

    # --- what other processes left behind ----------------------------------------------------------

    def sync(self, registry: Path) -> list[str]:
        """Replay this store's pending journals; one line per journal replayed."""
        lines = []
        for pointer, path in journal.pending(registry, self.uri):
            if not path.is_file():
                lines.append(journal.missing_line(path))
                pointer.unlink(missing_ok=True)
                continue
            if journal.start_of(path).get("experiment", self.experiment) != self.experiment:
                continue  # another experiment's job: its own store object replays it
            try:
                sent = self.replay(path, pointer)
            except Exception as err:  # noqa: BLE001 - one journal's trouble must not stop this job
                lines.append(f"journal {path} not replayed ({type(err).__name__}: {str(err).splitlines()[0][:120]}); "
                             f"python -m src.sync {path.parent} retries it")
                continue
            if sent:
                lines.append(f"replayed {sent} journaled record(s) of {path.parent} into {self.uri}")
        return lines

    def replay(self, path: Path, pointer: Path | None = None) -> int | None:
        """Send a journal's undelivered records here (all of a job's, where this store lost its run); its
        pending entry goes once they are all settled, and the sweeps it touched recount their jobs.
        None: its job still runs (it holds the journal)."""
        done = journal.replay(path, self.apply, self.holds, refusal)
        if done is None:
            return None
        sent, refused = done
        if refused:
            log.warning("%d record(s) of %s refused by %s (reasons in the journal)", refused, path, self.uri)
        if pointer is not None:
            pointer.unlink(missing_ok=True)
        if sent:
            self.recount(journal.run_ids(path))
        return sent

    def holds(self, run_id: str) -> bool:
        try:
            self.client.get_run(run_id)
        except MlflowException as err:
            if err.error_code == LOST:
                return False
            raise
        return True

    def recount(self, run_ids: list[str]) -> None:
        """Ended sweeps whose jobs were replayed: their job counts as the store now holds them."""
        parents = set()
        for run_id in run_ids:
            try:
                parents.add(self.client.get_run(run_id).data.tags.get("mlflow.parentRunId"))
            except MlflowException:
                continue
        for parent_id in parents - {None}:
            parent = self.client.get_run(parent_id)
            if parent.info.status != "RUNNING":   # a running sweep counts when it closes
                self.close_sweep(parent_id, parent.info.status)

    def reap(self) -> list[str]:
        """End runs left RUNNING by owners that are gone: jobs as failed (interrupted), then their sweeps."""
        lines = []
        running = self._search("attributes.status = 'RUNNING'", max_results=1000)
        for run in sorted(running, key=lambda r: r.data.tags.get(ROLE) == "sweep"):  # jobs first
            tags = run.data.tags
            why = owner.gone(tags.get(OWNER), tags.get(HEARTBEAT))
            if not why:
                continue
            reason = f"interrupted: {why} without ending the run"
            if tags.get(ROLE) == "sweep":
                # Its jobs may all have ended (a store that was down when the sweep ended): then it is done.
                jobs = self.latest_jobs(run.info.run_id)
                done = jobs and all(j.data.tags.get(OUTCOME) in ("finished", "skipped") for j in jobs)
                counts = self.close_sweep(run.info.run_id, "FINISHED" if done else "FAILED",
                                          f"closed by a later process: {why}" if done else reason)
                lines.append(f"{run.info.run_name} was left running ({why}); closed with "
                             + ", ".join(f"{n} {o}" for o, n in counts.items() if n))
            else:
                self._end_run(run.info.run_id, "failed", reason)
                lines.append(f"job {run.info.run_name} was left running ({why}); marked failed")
        return lines

    def heartbeat(self, run_ids: list[str]) -> None:
        for run_id in run_ids:
            self.client.set_tag(run_id, HEARTBEAT, str(journal.now_ms()))


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
        raise StoreUnreachable(f"cannot open the tracking store {uri} ({first_line(err)}); fix or move it, or point "
                               f"tracking.uri at another store") from None
    for line in store.sync(registry):
        log.warning(line)
    if (uri, experiment) not in _opened:  # once per process: a sweep's later jobs need not look again
        for line in store.reap():
            log.warning(line)
    _opened[(uri, experiment)] = store
    return store


def refusal(err: Exception) -> str | None:
    """The reason a store that is up refused a record (MLflow's error code and first line), or None
    for any other failure."""
    if isinstance(err, MlflowException) and err.error_code in REFUSED and not _database_error(err):
        return f"{err.error_code}: {str(err).strip().splitlines()[0] if str(err).strip() else ''}"[:500]
    return None


def _database_error(err: MlflowException) -> bool:
    """MLflow answers a broken database (garbage over its file, a full or read-only disk) with BAD_REQUEST
    too; that is an outage to journal through, not a refusal of the record."""
    from sqlalchemy.exc import SQLAlchemyError
    return isinstance(err.__cause__, SQLAlchemyError) or str(err).lstrip().startswith("(sqlite3.")


class JobRun:
    """One job's run: every record journaled, then sent to the store while the store answers."""

    def __init__(self, store: Store | None, journal_: journal.Journal | None, uri: str, experiment: str):
        self.store = store
        self.journal = journal_
        self.uri, self.experiment = uri, experiment
        self.run_id: str | None = None
        self.parent_id: str | None = None
        self.outcome: str | None = None       # finished, skipped, failed or killed once the run has ended
        self.measured = (0, 0)                # examples measured and logged so far, of how many
        self.offline: str | None = None if store else "the store was unreachable at start"
        self._beat: threading.Event | None = None
        self._lock = threading.Lock()    # the system-metrics sampler records from its own thread

    def _record(self, op: str, **fields) -> None:
        with self._lock:
            self._send({"op": op, "time": journal.now_ms(), **fields})

    def _send(self, record: dict) -> None:
        seq = None
        if self.journal is not None:
            try:
                seq = self.journal.append(record)
            except OSError as err:  # a full or read-only disk: the store may still hold everything
                log.warning("journal %s unwritable (%s); results go to the store only", self.journal.path, err)
                self._drop_journal()
        if self.store is not None and self.offline is None:
            try:
                self.run_id = self.store.apply({**record, "seq": seq}, self.run_id)
            except MlflowException as err:
                reason = refusal(err)
                if reason:  # the store is up and says no: a bug to see, not an outage
                    if seq is not None:
                        self.journal.refuse(seq, self.run_id, reason)   # settled, never delivered
                    raise
                self._go_offline(err)   # LOST among them: the journal keeps it for a store that has the run
            except Exception as err:  # noqa: BLE001 - any other store failure: stop talking to it, keep journaling
                self._go_offline(err)
            else:
                if seq is not None:
                    try:
                        self.journal.ack(seq, self.run_id)
                    except OSError:
                        self._drop_journal()  # the store holds it; a journal that cannot ack is only noise
                return
        if self.journal is None:
            raise StoreUnreachable(f"neither the tracking store ({self.offline}) nor a journal could record "
                                   f"this job's results")

    def _go_offline(self, err: Exception) -> None:
        self.offline = first_line(err)[:160]
        where = f"journaling to {self.journal.path}" if self.journal else "and no journal is writable"
        log.warning("tracking store failed (%s); the job goes on, %s", self.offline, where)

    def _drop_journal(self) -> None:
        try:
            self.journal.close()  # stays listed for a replay only if it holds records the store lacks
        except OSError:
            pass
        self.journal = None

    def start(self, name: str, sweep: SweepInfo | None, params: dict[str, str], tags: dict[str, str],
              job_key: str) -> None:
        self._record("start", name=name, sweep=sweep.as_dict() if sweep else None, params=params,
                     journal=self.journal.id if self.journal else key_of(f"{owner.me()}{time.time()}"),
                     tags={ROLE: "job", JOB_KEY: job_key, OWNER: owner.me(), HEARTBEAT: str(journal.now_ms()), **tags},
                     uri=self.uri, experiment=self.experiment)
        if self.store is not None and self.offline is None:
            self.parent_id = self.store.client.get_run(self.run_id).data.tags.get("mlflow.parentRunId")
            self._start_heartbeat()

    def _start_heartbeat(self) -> None:
        self._beat = threading.Event()
        runs = [r for r in (self.run_id, self.parent_id) if r]

        def beat():
            while not self._beat.wait(owner.HEARTBEAT_S):
                if self.offline:
                    return
                try:
                    self.store.heartbeat(runs)
                except Exception:  # noqa: BLE001 - the main thread's next record will notice and journal
                    return

        threading.Thread(target=beat, name="quantspec-heartbeat", daemon=True).start()

    def log_params(self, params: dict[str, str]) -> None:
        self._record("params", params=params)

    def set_tags(self, tags: dict[str, str]) -> None:
        self._record("tags", tags={k: str(v) for k, v in tags.items()})

    def log_metrics(self, values: dict[str, float], step: int = 0) -> None:
        now = journal.now_ms()
        metrics = [[k, float(v), now, step] for k, v in values.items() if not math.isnan(float(v))]
        if metrics:
            self._record("metrics", metrics=metrics)

    def log_text(self, text: str, name: str) -> None:
        self._record("text", text=text, name=name)

    def log_input(self, text, context: str) -> None:
        """Text the job read (a src.corpus.TextInput), as an MLflow dataset input in `context`."""
        self._record("input", dataset=text.as_dict(), context=context)

    def _end(self, outcome: str, reason: str | None = None) -> None:
        self.outcome = outcome
        if self._beat is not None:
            self._beat.set()
        try:
            self._record("end", outcome=outcome, reason=(reason or "")[:5000])
        finally:
            if self.journal is not None:
                self.journal.close()

    def finish(self) -> None:
        self._end("finished")

    def skip(self, reason: str) -> None:
        # KILLED, not FINISHED: a skipped job has no results, and status filters in the UI should show that.
        self._end("skipped", reason)

    def kill(self, reason: str) -> None:
        self._end("killed", reason)

    def fail(self, err: BaseException, note: str = "") -> None:
        try:
            self.log_text("".join(traceback.format_exception(err)), "error.txt")
        finally:
            self._end("failed", f"{type(err).__name__}: {err}"[:2000] + note)

    def where(self) -> str | None:
        """Where the results wait when the store did not take them all, else None."""
        if self.offline and self.journal is not None:
            return str(self.journal.path)
        return None
