"""One job's run: every record goes first to the job's local journal (src.tracking.store.journal), then to the
store while it answers, so a store that fails mid-job costs nothing measured and the job goes on; a
heartbeat thread says its owner is alive."""

from __future__ import annotations

import logging
import math
import threading
import time
import traceback
from collections.abc import Iterable
from pathlib import Path

from mlflow.exceptions import MlflowException

from src.common import signals
from src.common.locks import atomic_write_text
from src.tracking.store import journal, owner
from src.tracking.store.experiment import Store, heartbeat
from src.tracking.store.names import (
    HEARTBEAT,
    JOB_KEY,
    OWNER,
    ROLE,
    StoreUnreachable,
    SweepInfo,
    first_line,
    key_of,
    refusal,
)
from src.tracking.store.replay import apply

log = logging.getLogger("quantspec")


class JobRun:
    """One job's run: every record journaled, then sent to the store while the store answers."""

    def __init__(self, store: Store | None, journal_: journal.Journal | None, uri: str, experiment: str):
        self.store = store
        self.journal = journal_
        self.uri, self.experiment = uri, experiment
        self.run_id: str | None = None
        self.parent_id: str | None = None
        self.outcome: str | None = None  # finished, skipped, failed or killed once the run has ended
        self.measured = (0, 0)  # examples measured and logged so far, of how many
        self.offline: str | None = None if store else "the store was unreachable at start"
        self._beat: threading.Event | None = None
        self._lock = threading.Lock()  # the system-metrics sampler records from its own thread

    def _record(self, op: str, **fields) -> None:
        # whole, journal line and store call: a stop arriving inside is raised once both are done
        with self._lock, signals.deferred():
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
                self.run_id = apply(self.store, {**record, "seq": seq}, self.run_id)
            except MlflowException as err:
                reason = refusal(err)
                if reason:  # the store is up and says no: a bug to see, not an outage
                    if seq is not None:
                        self.journal.refuse(seq, self.run_id, reason)  # settled, never delivered
                    raise
                self._go_offline(err)  # LOST among them: the journal keeps it for a store that has the run
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
            raise StoreUnreachable(
                f"neither the tracking store ({self.offline}) nor a journal could record this job's results"
            )

    def _go_offline(self, err: Exception) -> None:
        self.offline = first_line(err)[:160]
        db = Path(self.uri.removeprefix("sqlite:///")) if self.uri.startswith("sqlite:///") else None
        if db is not None and not db.exists():  # SQLite says "readonly database" of a file deleted under it
            self.offline = f"its file {db} is gone, deleted while the job ran"
        where = f"journaling to {self.journal.path}" if self.journal else "and no journal is writable"
        log.warning("tracking store failed (%s); the job goes on, %s", self.offline, where)

    def _drop_journal(self) -> None:
        try:
            self.journal.close()  # stays listed for a replay only if it holds records the store lacks
        except OSError:
            pass
        self.journal = None

    def start(
        self, name: str, sweep: SweepInfo | None, params: dict[str, str], tags: dict[str, str], job_key: str
    ) -> None:
        self._record(
            "start",
            name=name,
            sweep=sweep.as_dict() if sweep else None,
            params=params,
            journal=self.journal.id if self.journal else key_of(f"{owner.me()}{time.time()}"),
            tags={ROLE: "job", JOB_KEY: job_key, OWNER: owner.me(), HEARTBEAT: str(journal.now_ms()), **tags},
            uri=self.uri,
            experiment=self.experiment,
        )
        if self.store is not None and self.offline is None:
            self.parent_id = self.store.client.get_run(self.run_id).data.tags.get("mlflow.parentRunId")
            self._start_heartbeat()

    def _start_heartbeat(self) -> None:
        self._beat = threading.Event()
        runs = [r for r in (self.run_id, self.parent_id) if r]

        def beat():
            while not self._beat.wait(owner.heartbeat_s()):
                if self.offline:
                    return
                try:
                    heartbeat(self.store, runs)
                except Exception:  # noqa: BLE001 - the main thread's next record will notice and journal
                    return

        threading.Thread(target=beat, name="quantspec-heartbeat", daemon=True).start()

    def log_params(self, params: dict[str, str]) -> None:
        self._record("params", params=params)

    def set_tags(self, tags: dict[str, str]) -> None:
        self._record("tags", tags={k: str(v) for k, v in tags.items()})

    def log_metrics(self, values: dict[str, float], step: int = 0) -> None:
        self.log_points((k, v, step) for k, v in values.items())

    def log_points(self, points: Iterable[tuple[str, float, int]]) -> None:
        """(name, value, step) triples, each at its own step, as one record (one journal line, one store call):
        what a job measured once its task ended goes in one, not a call per example and figure."""
        now = journal.now_ms()
        metrics = [[k, float(v), now, step] for k, v, step in points if not math.isnan(float(v))]
        if metrics:
            self._record("metrics", metrics=metrics)

    def log_text(self, text: str, name: str, beside: bool = False) -> None:
        """`text` as the run's artifact `name`; `beside`: also as a file of that name in the job's own folder
        (beside run.log and journal.jsonl), for a script that reads a sweep's files without MLflow's API."""
        self._record("text", text=text, name=name)
        if beside and self.journal is not None:
            atomic_write_text(self.journal.path.parent / name, text)

    def log_input(self, text, context: str) -> None:
        """Text the job read (a src.data.corpus.TextInput), as an MLflow dataset input in `context`."""
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
