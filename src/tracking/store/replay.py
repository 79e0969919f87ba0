"""A job's records carried out in the store: each journal op as MLflow calls (what a live job sends, and
what a replay resends), and the replay of journals a store is owed, after which the sweeps they touched
count their jobs again."""

from __future__ import annotations

import logging
from pathlib import Path

from mlflow.entities import Dataset, DatasetInput, InputTag, Metric, Param
from mlflow.exceptions import MlflowException

from src.common.say import message_line
from src.tracking.store import journal
from src.tracking.store.locks import replay_lock
from src.tracking.store.names import BATCH, JOURNAL, LOST, OWNER, refusal

log = logging.getLogger("quantspec")


def apply(store, record: dict, run_id: str | None) -> str:
    """Carry out one journal record; returns the run's id (a start creates it)."""
    op = record["op"]
    if op == "start":
        found = store.search(f"tags.`{JOURNAL}` = '{record['journal']}'", max_results=1)
        if found:  # a replay after a crash between create and ack: the run exists already
            return found[0].info.run_id
        tags = {**record["tags"], JOURNAL: record["journal"]}
        if record.get("sweep"):
            tags["mlflow.parentRunId"] = store.sweep_parent(record["sweep"], record["tags"].get(OWNER))
        run_id = store.client.create_run(
            store.experiment_id, run_name=record["name"], start_time=record["time"], tags=tags
        ).info.run_id
        op = "params"
    if run_id is None:
        raise ValueError(f"journal record {record['seq']} ({op}) has no run")
    if op == "params":
        items = [Param(k, v) for k, v in record["params"].items()]
        for i in range(0, len(items), BATCH):
            store.client.log_batch(run_id, params=items[i : i + BATCH])
    elif op == "tags":
        store.set_tags(run_id, record["tags"])
    elif op == "metrics":
        metrics = [Metric(k, v, t, s) for k, v, t, s in record["metrics"]]
        for i in range(0, len(metrics), 1000):
            store.client.log_batch(run_id, metrics=metrics[i : i + 1000])
    elif op == "text":
        store.client.log_text(run_id, record["text"], record["name"])
    elif op == "input":  # MLflow's dataset input: the UI's Dataset column and filter
        used = [DatasetInput(Dataset(**record["dataset"]), [InputTag("mlflow.data.context", record["context"])])]
        try:
            store.client.log_inputs(run_id, used)
        except MlflowException as err:
            # Two jobs recording the same new dataset at once: MLflow creates it in one and refuses the
            # other's create (a unique key); the second try finds it and links it.
            if "UNIQUE" not in str(err) and "unique" not in str(err):
                raise
            store.client.log_inputs(run_id, used)
    elif op == "end":
        store.end_run(run_id, record["outcome"], record.get("reason") or "", record["time"])
    return run_id


def sync(store, registry: Path) -> list[str]:
    """Replay this store's pending journals, and check their sweeps' other journals; one line per journal
    replayed."""
    lines = [journal.unreadable_line(pointer, why) for pointer, why in journal.unreadable(registry)]
    found, gone = journal.with_sweeps(journal.pending(registry, store.uri))
    lines += gone
    for pointer, path in found:
        if not path.is_file():
            lines.append(journal.missing_line(path))
            if pointer is not None:
                pointer.unlink(missing_ok=True)
            continue
        start = journal.start_of(path)
        if start.get("experiment", store.experiment) != store.experiment or start.get("uri", store.uri) != store.uri:
            continue  # another experiment's (or store's) job: its own store object replays it
        try:
            sent = replay(store, path, pointer)
        except Exception as err:  # noqa: BLE001 - one journal's trouble must not stop this job
            lines.append(
                f"journal {path} not replayed ({type(err).__name__}: {message_line(err)[:120]}); "
                f"python -m src.sync {path.parent} tracking.uri={store.uri} retries it"
            )
            continue
        if sent:
            lines.append(f"replayed {sent} journaled record(s) of {path.parent} into {store.uri}")
    return lines


def replay(store, path: Path, pointer: Path | None = None) -> int | None:
    """Send a journal's undelivered records here (all of a job's, where this store lost its run); its
    pending entry goes once they are all settled, and the sweeps it touched recount their jobs.
    None: its job still runs (it holds the journal). One replay or reaping at a time per store on this host
    (src.tracking.store.locks): a sweep is never counted while another process is half-way through its jobs."""
    with replay_lock(store.uri):
        done = journal.replay(
            path, lambda record, run_id: apply(store, record, run_id), lambda run_id: holds(store, run_id), refusal
        )
        if done is None:
            return None
        sent, refused = done
        if refused:
            log.warning("%d record(s) of %s refused by %s (reasons in the journal)", refused, path, store.uri)
        if pointer is not None:
            pointer.unlink(missing_ok=True)
        if sent:
            recount(store, journal.run_ids(path))
        return sent


def holds(store, run_id: str) -> bool:
    try:
        store.client.get_run(run_id)
    except MlflowException as err:
        if err.error_code == LOST:
            return False
        raise
    return True


def recount(store, run_ids: list[str]) -> None:
    """Ended sweeps whose jobs were replayed: their job counts as the store now holds them."""
    parents = set()
    for run_id in run_ids:
        try:
            parents.add(store.client.get_run(run_id).data.tags.get("mlflow.parentRunId"))
        except MlflowException:
            continue
    for parent_id in parents - {None}:
        parent = store.client.get_run(parent_id)
        if parent.info.status != "RUNNING":  # a running sweep counts when it closes
            store.close_sweep(parent_id, parent.info.status)
