"""The journal's exactly-once replay, run owners, and build locks, without a sweep around them."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time

from src.common.locks import file_lock
from src.tracking.store import journal, owner
from tests.support.cli import ROOT, cli_env


def test_replay_sends_only_what_the_store_lacks_and_each_start_opens_a_new_run(tmp_path):
    j = journal.Journal(tmp_path / "job", tmp_path / "registry", "sqlite:///x.db")
    first = j.append({"op": "start", "name": "a"})
    j.ack(first, "run-1")
    j.append({"op": "metrics", "metrics": [["m", 1.0, 0, 1]]})  # the store failed here
    j.append({"op": "end", "outcome": "finished"})
    j.close()
    assert journal.pending(tmp_path / "registry") == [(next((tmp_path / "registry").iterdir()), j.path)]
    again = journal.Journal(tmp_path / "job", tmp_path / "registry", "sqlite:///x.db")  # a rerun, same folder
    again.append({"op": "start", "name": "b"})
    again.close()
    with j.path.open("a") as f:
        f.write('{"seq": 99, "op": "tags", "ta')  # torn by a kill mid-write
    applied = []

    def apply(record, run_id):
        applied.append((record["op"], run_id))
        return run_id or f"run-{len(applied) + 1}"

    assert journal.replay(j.path, apply) == (3, 0)
    assert applied == [("metrics", "run-1"), ("end", "run-1"), ("start", None)]
    assert journal.replay(j.path, apply) == (0, 0)  # exactly once


def test_a_journal_in_use_is_not_replayed(tmp_path):
    j = journal.Journal(tmp_path, tmp_path / "registry", "u")
    j.append({"op": "start"})
    assert journal.replay(j.path, lambda r, i: "x") is None
    j.close()


def test_owners_are_judged_by_process_here_and_by_heartbeat_elsewhere():
    me = owner.me()
    assert owner.gone(me, None) is None
    host, boot, pid, start = me.split("|")
    assert "has ended" in owner.gone(f"{host}|{boot}|{pid}|{int(start) + 1}", None)  # the pid was reused
    assert "restarted" in owner.gone(f"{host}|another-boot|{pid}|{start}", None)
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    assert "has ended" in owner.gone(f"{host}|{boot}|{dead.pid}|1", None)
    elsewhere = f"not-{socket.gethostname()}|b|1|1"
    now = time.time()
    assert owner.gone(elsewhere, str(int((now - owner.STALE_HEARTBEATS * owner.heartbeat_s() / 2) * 1000)), now) is None
    assert "no heartbeat" in owner.gone(
        elsewhere, str(int((now - owner.STALE_HEARTBEATS * owner.heartbeat_s() - 5) * 1000)), now
    )
    assert owner.gone(None, None) is None  # runs from before owners were recorded are left alone


def _hold(path) -> subprocess.Popen:
    """Another process holding the lock on `path` (it says 'held' once it does) for ten minutes."""
    return subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys, time; from pathlib import Path; "
            "from src.common.locks import file_lock\nwith file_lock(Path(sys.argv[1]), 'x'):\n"
            "    print('held', flush=True); time.sleep(600)",
            str(path),
        ],
        cwd=ROOT,
        env=cli_env(),
        stdout=subprocess.PIPE,
        text=True,
    )


def test_a_lock_whose_holder_died_is_taken_at_once(tmp_path):
    path = tmp_path / "build.lock"
    holder = _hold(path)
    assert holder.stdout.readline().strip() == "held"
    holder.kill()
    holder.wait()
    began = time.time()
    with file_lock(path, "x"):
        assert time.time() - began < 2
    assert json.dumps(path.read_text())  # the lock names its last holder


def test_a_lock_whose_holder_is_stopped_is_given_up_in_one_line(tmp_path):
    """A build lock held by a process stopped with SIGSTOP: the waiter gives up within seconds, naming the
    holder and what to do, instead of waiting forever."""
    import signal

    import pytest

    from src.common.locks import LockStuck

    path = tmp_path / "build.lock"
    holder = _hold(path)
    try:
        assert holder.stdout.readline().strip() == "held"
        os.kill(holder.pid, signal.SIGSTOP)
        began = time.time()
        with pytest.raises(
            LockStuck, match=rf"its holder, pid {holder.pid} on .*, was stopped .*kill -CONT {holder.pid}"
        ):
            with file_lock(path, "the kernels"):
                pass
        assert time.time() - began < 20
    finally:
        holder.kill()
        holder.wait()


def test_a_refused_record_is_journaled_as_refused_never_as_delivered(tmp_path):
    import pytest
    from mlflow.exceptions import MlflowException

    from src.tracking.store.experiment import Store
    from src.tracking.store.jobrun import JobRun

    uri = f"sqlite:///{tmp_path / 'm.db'}"
    store = Store(uri, "quantspec")
    j = journal.Journal(tmp_path / "job", tmp_path / "registry", uri)
    run = JobRun(store, j, uri, "quantspec")
    run.start("job", None, {"a": "1"}, {}, "key")
    with pytest.raises(MlflowException):
        run.log_params({"a": "2"})  # MLflow refuses to change a param's value
    run.finish()
    lines = [json.loads(line) for line in j.path.read_text().splitlines()]
    refused = [line for line in lines if "refused" in line]
    assert len(refused) == 1 and "INVALID_PARAMETER_VALUE" in refused[0]["reason"]
    assert not any(line.get("ack") == refused[0]["refused"] for line in lines)
    assert journal.unsettled(j.path) == 0 and journal.pending(tmp_path / "registry") == []
    # a replay neither resends it nor fails on it
    assert journal.replay(j.path, lambda r, i: pytest.fail(f"resent {r}")) == (0, 0)


def test_a_replay_into_a_store_that_lost_the_run_sends_the_whole_job_once(tmp_path):
    j = journal.Journal(tmp_path / "job", tmp_path / "registry", "sqlite:///x.db")
    for op in ("start", "metrics", "end"):
        j.ack(j.append({"op": op}), "old-run")
    j.close()
    applied = []

    def apply(record, run_id):
        applied.append((record["op"], run_id))
        return run_id or "new-run"

    holds = lambda run_id: run_id == "new-run"  # noqa: E731 - the store has only what this replay made
    assert journal.replay(j.path, apply, holds) == (3, 0)
    assert applied == [("start", None), ("metrics", "new-run"), ("end", "new-run")]
    assert journal.replay(j.path, apply, holds) == (0, 0) and journal.run_ids(j.path) == ["new-run"]


def test_closing_a_sweep_again_clears_an_earlier_reason(tmp_path):
    from src.tracking.store.experiment import Store
    from src.tracking.store.names import REASON

    store = Store(f"sqlite:///{tmp_path / 'm.db'}", "quantspec")
    parent = store.sweep_parent({"id": "/sweep", "name": "sweep", "overrides": ""})
    store.close_sweep(parent, "FAILED", "interrupted: its process has ended")
    store.close_sweep(parent)  # the same sweep, resumed and finished
    assert store.client.get_run(parent).data.tags[REASON] == ""


def _claim_parent(uri: str, barrier, out) -> None:
    from src.tracking.store.experiment import Store

    store = Store(uri, "quantspec")
    barrier.wait()  # every process asks at the same moment
    out.put(store.sweep_parent({"id": "/sweeps/one", "name": "sweep one", "overrides": ""}, who="someone gone"))


def test_processes_asking_for_a_sweeps_parent_at_once_get_one(tmp_path, monkeypatch):
    import multiprocessing

    from src.tracking.store.experiment import Store

    monkeypatch.setenv("QUANTSPEC_CACHE", str(tmp_path / "cache"))
    uri = f"sqlite:///{tmp_path / 'm.db'}"
    Store(uri, "quantspec")  # the schema made first: the race is over the parent, not the tables
    ctx = multiprocessing.get_context("fork")
    barrier, out = ctx.Barrier(4), ctx.Queue()
    procs = [ctx.Process(target=_claim_parent, args=(uri, barrier, out)) for _ in range(4)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(timeout=120)
    assert [p.exitcode for p in procs] == [0] * 4
    assert len({out.get(timeout=5) for _ in procs}) == 1


def _journal_a_job_and_exit(tmp_path, uri: str) -> None:
    """A sweep's job that recorded only to its journal (its store was down), in a process that then ends."""
    from src.tracking.store.jobrun import JobRun
    from src.tracking.store.names import SweepInfo

    run = JobRun(None, journal.Journal(tmp_path / "job", tmp_path / "registry", uri), uri, "quantspec")
    run.start("job", SweepInfo("/sweeps/two", "sweep two", ""), {"a": "1"}, {}, "key")
    run.log_metrics({"time_per_token_ms_median": 1.0})
    run.finish()


def _replay_pausing_after_the_start(uri: str, path, started, go) -> None:
    from src.tracking.store import replay
    from src.tracking.store.experiment import Store

    store, apply = Store(uri, "quantspec"), replay.apply

    def slow_apply(record, run_id):
        run_id = apply(store, record, run_id)
        if record["op"] == "start":  # the job's run and its sweep's parent exist, RUNNING, owned by the dead job
            started.set()
            go.wait(60)
        return run_id

    replay.apply = lambda store_, record, run_id: slow_apply(record, run_id)
    replay.replay(store, path)


def test_a_reaping_waits_for_a_replay_under_way_and_the_sweep_closes_with_every_job(tmp_path, monkeypatch):
    """Two syncs at once: the second reaps while the first is half-way through a journal. Its runs' owner
    (the job) is gone, yet they are being ended: the reaper waits, so the sweep closes finished, counting it."""
    import multiprocessing
    import threading

    from src.tracking.store import reaping
    from src.tracking.store.experiment import Store
    from src.tracking.store.names import OUTCOME

    monkeypatch.setenv("QUANTSPEC_CACHE", str(tmp_path / "cache"))
    uri = f"sqlite:///{tmp_path / 'm.db'}"
    store = Store(uri, "quantspec")
    ctx = multiprocessing.get_context("fork")
    job = ctx.Process(target=_journal_a_job_and_exit, args=(tmp_path, uri))
    job.start()
    job.join(60)
    assert job.exitcode == 0
    path = next((tmp_path / "job").rglob(journal.FILE))
    started, go = ctx.Event(), ctx.Event()
    replayer = ctx.Process(target=_replay_pausing_after_the_start, args=(uri, path, started, go))
    replayer.start()
    try:
        assert started.wait(60)
        reaped: list[str] = []
        reaper = threading.Thread(target=lambda: reaped.extend(reaping.reap(store)))
        reaper.start()
        reaper.join(1.5)
        assert reaper.is_alive(), f"reaped during a replay: {reaped}"
    finally:
        go.set()
        replayer.join(60)
    reaper.join(60)
    assert replayer.exitcode == 0
    (parent,) = store.search("tags.`quantspec.role` = 'sweep'")
    (run,) = store.search("tags.`quantspec.role` = 'job'")
    assert run.data.tags[OUTCOME] == "finished" and run.info.status == "FINISHED"
    assert parent.info.status == "FINISHED" and parent.data.tags["jobs_finished"] == "1", reaped


def test_a_resend_into_a_new_store_stopped_midway_resumes_where_it_stopped_and_ends_the_job(tmp_path):
    """The store lost the run (a server on a fresh backend); the replay re-sending the job is stopped after two
    records (SIGTERM's Stopped, raised between records). Its acks name the new run, so the next replay sends the
    records that run lacks, its end included, each once: the old run's acks are no delivery to the new one."""
    import pytest

    from src.common.signals import Stopped

    j = journal.Journal(tmp_path / "job", tmp_path / "registry", "sqlite:///x.db")
    ops = ["start", "params", "metrics", "metrics", "text", "end"]
    for op in ops:
        j.ack(j.append({"op": op}), "old-run")
    j.close()
    applied = []

    def stopped_after_two(record, run_id):
        if len(applied) == 2:
            raise Stopped(15)
        applied.append((record["op"], run_id))
        return run_id or "new-run"

    holds = lambda run_id: run_id == "new-run"  # noqa: E731 - the fresh store holds only what the re-send made
    with pytest.raises(Stopped):
        journal.replay(j.path, stopped_after_two, holds)
    assert applied == [("start", None), ("params", "new-run")]
    assert journal.unsettled(j.path) == 4  # still owed: it stays listed, never "already in the store"
    resumed = []

    def apply(record, run_id):
        resumed.append((record["op"], run_id))
        return run_id or "another-run"

    assert journal.replay(j.path, apply, holds) == (4, 0)
    assert resumed == [(op, "new-run") for op in ops[2:]]  # the end among them: the job is closed as it ended
    assert journal.replay(j.path, apply, holds) == (0, 0) and journal.unsettled(j.path) == 0
    assert journal.run_ids(j.path) == ["new-run"]
