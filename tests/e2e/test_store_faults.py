"""The tracking store's faults, with real processes: a server killed mid-job, restarted on a fresh backend, a store
deleted, garbage, half made or on a full disk, a dead or silent server; every record kept in the job's journal and
replayed exactly once by sync (moved journals, two syncs at once, a sync stopped midway, a store the user chose).
"""

from __future__ import annotations

import signal
import subprocess
import sys
import time

import pytest
from mlflow.tracking import MlflowClient

from tests.support.cli import ROOT, cli_env, fresh_cache, overridden, run_cli
from tests.support.faults import QUICK, SLOW, by_role, can_mount, metric_counts, runs, said, start, stop, wait_for
from tests.support.processes import free_port, mlflow_server


def test_a_lost_tracking_server_loses_nothing_and_sync_replays_exactly_once(tmp_path, env):
    port = free_port()
    uri = f"http://127.0.0.1:{port}"
    server_args = ["tracking=server", f"tracking.uri={uri}"]
    # nothing answers: one line within seconds, and nothing run
    began = time.time()
    refused = run_cli([*QUICK, *server_args, f"hydra.run.dir={tmp_path / 'refused'}"], env=env)
    assert refused.returncode == 2 and time.time() - began < 30
    assert said(refused.stderr) == [said(refused.stderr)[0]] and "does not answer" in refused.stderr
    # ... or, by choice, the job runs and journals
    offline = run_cli(
        [*QUICK, *server_args, "tracking.unreachable=journal", f"hydra.run.dir={tmp_path / 'offline'}"], env=env
    )
    assert offline.returncode == 0, offline.stderr[-2000:]
    assert "journaled in" in offline.stderr and (tmp_path / "offline" / "journal.jsonl").is_file()
    # the server dies in the middle of a job: the job finishes, prints its table and journals
    server = mlflow_server(tmp_path, port)
    try:
        proc = start(["-m", *SLOW, *server_args, f"hydra.sweep.dir={tmp_path / 'lost'}"], tmp_path, "lost")
        wait_for(tmp_path / "lost.out", "example 1/", proc)
        stop(server)
        killed = time.time()
        assert proc.wait(timeout=120) == 0, (tmp_path / "lost.err").read_text()[-2000:]
        assert time.time() - killed < 60
        assert "decode (executed on cpu)" in (tmp_path / "lost.out").read_text()  # the table was printed
        err = (tmp_path / "lost.err").read_text()
        assert [line for line in said(err) if "journaled in" in line] and "Traceback" not in err
        # the offline job's journal went in when the lost job opened the store, by itself
        # back up: a sync replays the lost job's journal; a second sync sends nothing
        server = mlflow_server(tmp_path, port)
        torn = tmp_path / "cache" / "journals" / "torn.json"  # an entry that does not read: it could name a job
        torn.write_text('{"path": ')  # of this sweep, so the sweep is not closed yet
        synced = run_cli([], module="src.sync", env=env)
        assert synced.returncode == 1 and "torn.json does not read" in synced.stderr, synced.stderr[-2000:]
        assert "1 journal(s) replayed" in synced.stdout and "are not closed yet" in synced.stdout
        assert by_role(uri)[0][0].info.status == "RUNNING"
        synced = run_cli(
            [str(tmp_path / "lost"), f"tracking.uri={uri}"], module="src.sync", env=env
        )  # as the line says
        assert synced.returncode == 0, synced.stderr[-2000:]
        assert "already in the store" in synced.stdout and "closed with 1 finished" in synced.stdout
        torn.unlink()
        again = run_cli(
            [str(tmp_path / "offline"), str(tmp_path / "lost"), f"tracking.uri={uri}"], module="src.sync", env=env
        )
        assert again.stdout.count("already in the store") == 2
        (parent,), jobs = by_role(uri)
        assert len(jobs) == 2 and all(j.info.status == "FINISHED" for j in jobs)
        # the sweep ended while the server was down: the sync closed its parent, with the store's counts
        assert parent.info.status == "FINISHED" and parent.data.tags["jobs_finished"] == "1"
        client = MlflowClient(uri)
        for job in jobs:
            examples = int(job.data.metrics["examples"])
            assert len(client.get_metric_history(job.info.run_id, "by_example/time_per_token_ms")) == examples
            assert "examples.md" in {a.path for a in client.list_artifacts(job.info.run_id)}
    finally:
        if server.poll() is None:
            stop(server)


@pytest.mark.skipif(not can_mount(), reason="needs `unshare -m` and tmpfs mounts (root in a mount namespace)")
def test_a_store_on_a_full_disk_loses_nothing(tmp_path):
    """The store's disk fills: a single job and then a whole sweep journal in one line each, no traceback;
    after the sync the store holds every job and the sweep's counts are the store's. Then the store's
    file system turns read-only: one line."""
    full, uri = tmp_path / "full", f"sqlite:///{tmp_path / 'full' / 'm.db'}"
    full.mkdir()
    quick = " ".join(QUICK)
    script = f"""
set -u
mount -t tmpfs -o size=8m tmpfs {full}
{sys.executable} -m src.run {quick} tracking.uri={uri} hydra.run.dir={tmp_path / "first"} >/dev/null 2>&1 || exit 3
dd if=/dev/zero of={full}/fill bs=4k 2>/dev/null
{sys.executable} -m src.run {quick} tracking.uri={uri} hydra.run.dir={tmp_path / "second"} \
    >{tmp_path / "second.out"} 2>{tmp_path / "second.err"}
echo "rc=$?"
{sys.executable} -m src.run -m {quick} precision=fp32,bf16 tracking.uri={uri} hydra.sweep.dir={tmp_path / "sweep"} \
    >{tmp_path / "sweep.out"} 2>{tmp_path / "sweep.err"}
echo "sweep rc=$?"
rm {full}/fill
{sys.executable} -m src.sync
{sys.executable} -m src.sync {tmp_path / "sweep"}
mount -o remount,ro {full}
{sys.executable} -m src.run {quick} tracking.uri={uri} hydra.run.dir={tmp_path / "ro"} \
    >{tmp_path / "ro.out"} 2>{tmp_path / "ro.err"}
echo "ro rc=$?"
cp {full}/m.db {tmp_path / "kept.db"}  # the store, read below: the tmpfs goes with this namespace
"""
    out = subprocess.run(
        ["unshare", "-m", "bash", "-c", script],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=900,
        env=cli_env({"QUANTSPEC_CACHE": str(fresh_cache(tmp_path / "cache"))}),
    )
    assert "rc=0" in out.stdout, out.stdout + out.stderr + (tmp_path / "second.err").read_text()
    assert "journaled in" in (tmp_path / "second.err").read_text()
    sweep_err = (tmp_path / "sweep.err").read_text()
    assert "Traceback" not in sweep_err and "Traceback" not in (tmp_path / "second.err").read_text(), sweep_err
    assert len([line for line in sweep_err.splitlines() if "journaled in" in line]) == 2
    sweeps, jobs = by_role(f"sqlite:///{tmp_path / 'kept.db'}")
    assert [(r.info.status, int(r.data.metrics.get("examples", 0))) for r in jobs] == [("FINISHED", 2)] * 4, out.stdout
    assert [(r.info.status, r.data.tags.get("jobs_finished"), r.data.tags.get("jobs_running")) for r in sweeps] == [
        ("FINISHED", "2", "0")
    ], out.stdout + out.stderr
    # a read-only store: one line, no traceback (at start it cannot be opened for writing)
    ro = (tmp_path / "ro.err").read_text() + (tmp_path / "ro.out").read_text()
    assert "Traceback" not in ro and len(said((tmp_path / "ro.err").read_text())) == 1, ro[-3000:]


def test_a_server_restarted_on_a_fresh_backend_gets_the_job_from_its_journal(tmp_path, env):
    """The store forgets the run mid-job: nothing is marked delivered that it does not hold, and a sync
    recreates the job there, whole, exactly once."""
    port = free_port()
    uri = f"http://127.0.0.1:{port}"
    first, second = tmp_path / "a", tmp_path / "b"
    first.mkdir()
    second.mkdir()
    server = mlflow_server(first, port)
    try:
        proc = start(
            [
                *overridden(SLOW, "task.limit=2"),
                "tracking=server",
                f"tracking.uri={uri}",
                f"hydra.run.dir={tmp_path / 'job'}",
            ],
            tmp_path,
            "job",
        )
        wait_for(tmp_path / "job.out", "example 1/", proc)
        stop(server)
        server = mlflow_server(second, port)  # the same address, an empty backend
        assert proc.wait(timeout=300) == 0, (tmp_path / "job.err").read_text()[-2000:]
        err = (tmp_path / "job.err").read_text()
        assert "journaled in" in err and "Traceback" not in err
        synced = run_cli([], module="src.sync", env=env)
        assert synced.returncode == 0 and "1 journal(s) replayed" in synced.stdout, synced.stdout + synced.stderr
        assert metric_counts(uri) == [("finished", 2)]
        again = run_cli([str(tmp_path / "job"), f"tracking.uri={uri}"], module="src.sync", env=env)
        assert again.returncode == 0 and "already in the store" in again.stdout
        assert metric_counts(uri) == [("finished", 2)]
        nothing = run_cli([], module="src.sync", env=env)  # nothing pending: exit 0
        assert nothing.returncode == 0 and "0 journal(s) replayed, 0 not" in nothing.stdout
    finally:
        stop(server)


def test_a_store_deleted_mid_sweep_is_rebuilt_from_the_journals(tmp_path, env):
    """Deleted while the second of three jobs runs: the first job's journal was settled (the store had it)
    and unlisted, yet a plain sync, which starts from the listed journals, brings back all three."""
    db = tmp_path / "m.db"
    uri = f"sqlite:///{db}"
    sweep = tmp_path / "sweep"
    proc = start(
        [
            "-m",
            *overridden(SLOW, "task.limit=2"),
            "precision=fp32,bf16,w8a8",
            f"tracking.uri={uri}",
            f"hydra.sweep.dir={sweep}",
            "report_at_end=false",
        ],
        tmp_path,
    )
    deadline = time.time() + 300
    while (tmp_path / "run.out").read_text().count("example 1/") < 2:  # the second job is under way
        assert proc.poll() is None and time.time() < deadline, (tmp_path / "run.out").read_text()[-2000:]
        time.sleep(0.1)
    db.unlink()
    assert proc.wait(timeout=300) in (0, 1)
    err = (tmp_path / "run.err").read_text()
    assert "Traceback" not in err
    # the cause, not SQLAlchemy's advice about autoflush (SQLite calls a file deleted under it "readonly")
    assert "autoflush" not in err and f"its file {db} is gone, deleted while the job ran" in err, err[-3000:]
    synced = run_cli([], module="src.sync", env=env)
    assert synced.returncode == 0, synced.stdout + synced.stderr
    assert metric_counts(uri) == [("finished", 2)] * 3, synced.stdout
    (parent,), _ = by_role(uri)
    assert parent.data.tags["jobs_finished"] == "3"
    again = run_cli([str(sweep), f"tracking.uri={uri}"], module="src.sync", env=env)
    assert again.returncode == 0 and again.stdout.count("already in the store") == 3
    assert metric_counts(uri) == [("finished", 2)] * 3


def test_a_garbage_store_is_one_line_at_start_and_journaled_mid_sweep(tmp_path, env):
    db = tmp_path / "m.db"
    db.write_bytes(b"not a database " * 1000)
    uri = f"sqlite:///{db}"
    began = time.time()
    out = run_cli([*QUICK, f"tracking.uri={uri}", f"hydra.run.dir={tmp_path / 'first'}"], env=env)
    assert out.returncode == 2 and time.time() - began < 60
    assert len(said(out.stderr)) == 1 and "cannot open the tracking store" in out.stderr
    assert "Traceback" not in out.stderr + out.stdout
    db.unlink()
    sweep = tmp_path / "sweep"
    proc = start(
        [
            "-m",
            *overridden(SLOW, "task.limit=2"),
            "precision=fp32,bf16",
            f"tracking.uri={uri}",
            f"hydra.sweep.dir={sweep}",
            "report_at_end=false",
        ],
        tmp_path,
    )
    wait_for(tmp_path / "run.out", "example 1/", proc)
    db.write_bytes(b"garbage " * 100_000)  # over the store, mid-job
    proc.wait(timeout=300)
    err = (tmp_path / "run.err").read_text()
    assert "Traceback" not in err and "journaled in" in err, err[-3000:]
    db.unlink()
    synced = run_cli([str(sweep), f"tracking.uri={uri}"], module="src.sync", env=env)
    assert synced.returncode == 0, synced.stdout + synced.stderr
    assert metric_counts(uri) == [("finished", 2), ("finished", 2)]


def _journaled_job(tmp_path, env) -> tuple[int, str]:
    """A job run while its tracking server is not up (its records journaled, its folder tmp_path/job): the port and
    address the server is then started on."""
    port = free_port()
    uri = f"http://127.0.0.1:{port}"
    out = run_cli(
        [
            *QUICK,
            "tracking=server",
            f"tracking.uri={uri}",
            "tracking.unreachable=journal",
            f"hydra.run.dir={tmp_path / 'job'}",
        ],
        env=env,
    )
    assert out.returncode == 0, out.stderr[-2000:]
    return port, uri


def test_a_moved_journal_is_named_and_found_where_it_went(tmp_path, env):
    port, uri = _journaled_job(tmp_path, env)
    (tmp_path / "job").rename(tmp_path / "moved")
    server = mlflow_server(tmp_path, port)
    try:
        lost = run_cli([], module="src.sync", env=env)
        assert lost.returncode == 1 and "is listed as pending but is gone" in lost.stderr
        assert "python -m src.sync <its new folder>" in lost.stderr
        found = run_cli([str(tmp_path / "moved"), f"tracking.uri={uri}"], module="src.sync", env=env)
        assert found.returncode == 0 and "1 journal(s) replayed" in found.stdout
        assert metric_counts(uri) == [("finished", 2)]
        assert run_cli([], module="src.sync", env=env).returncode == 0  # nothing listed any more
    finally:
        stop(server)


def test_two_syncs_at_once_rebuild_one_sweep_under_one_parent(tmp_path, env):
    uri = f"sqlite:///{tmp_path / 'm.db'}"
    sweep = tmp_path / "sweep"
    out = run_cli(
        [
            "-m",
            *QUICK,
            "precision=fp32,bf16,w8a8",
            f"tracking.uri={uri}",
            f"hydra.sweep.dir={sweep}",
            "report_at_end=false",
        ],
        env=env,
    )
    assert out.returncode == 0, out.stderr[-2000:]
    (tmp_path / "m.db").unlink()  # the store lost: both syncs find every job missing and send it whole
    syncs = [start([str(sweep), f"tracking.uri={uri}"], tmp_path, name=f"sync{i}", module="src.sync") for i in range(2)]
    assert [p.wait(timeout=300) for p in syncs] == [0, 0], [(tmp_path / f"sync{i}.err").read_text() for i in range(2)]
    parents, jobs = by_role(uri)
    assert len(parents) == 1 and len(jobs) == 3, (len(parents), len(jobs))
    assert all(j.data.tags["mlflow.parentRunId"] == parents[0].info.run_id for j in jobs)
    assert parents[0].data.tags["jobs_finished"] == "3"


def test_sync_writes_only_to_a_store_the_user_chose_not_to_any_a_journal_names(tmp_path, env):
    """A journal planted in a folder names a store elsewhere, and so does a Hydra config planted beside it (the
    fifth round's case: the config vouched for the store and sync wrote there): sync of that folder refuses it in
    one line and creates nothing there; named on the command line, the same store gets it."""
    from src.tracking.store import journal
    from src.tracking.store.jobrun import JobRun

    planted = tmp_path / "elsewhere" / "planted.db"
    uri = f"sqlite:///{planted}"
    run = JobRun(None, journal.Journal(tmp_path / "folder" / "job", tmp_path / "registry", uri), uri, "quantspec")
    run.start("planted", None, {"a": "1"}, {}, "key")
    run.finish()
    (hydra := tmp_path / "folder" / "job" / ".hydra").mkdir(parents=True)
    (hydra / "config.yaml").write_text(f"tracking:\n  uri: {uri}\n")  # "its job's config" says the same store
    out = run_cli([str(tmp_path / "folder")], module="src.sync", env=env)
    assert out.returncode == 1 and not (tmp_path / "elsewhere").exists(), out.stdout + out.stderr
    (line,) = said(out.stderr)
    assert f"written for the store '{uri}'" in line and "tracking.uri=<that store>" in line
    out = run_cli([str(tmp_path / "folder"), f"tracking.uri={uri}"], module="src.sync", env=env)
    assert out.returncode == 0 and "record(s) replayed into" in out.stdout, out.stdout + out.stderr
    assert [r.info.run_name for r in runs(uri)] == ["planted"]


def test_sync_of_a_folder_that_is_not_there_is_one_line(tmp_path, env):
    """A mistyped sweep directory had been said as "journal ... is listed as pending but is gone"."""
    out = run_cli([str(tmp_path / "a-mistyped-sweep-dir")], module="src.sync", env=env)
    assert out.returncode == 2 and said(out.stderr) == [out.stderr.strip()], out.stdout + out.stderr
    assert "a-mistyped-sweep-dir: no such journal or folder; name a sweep's directory" in out.stderr


@pytest.mark.parametrize("module, args", [("src.report", []), ("src.regress", ["against=x"])])
def test_the_commands_that_read_a_store_say_a_dead_or_silent_server_in_one_line_within_seconds(module, args):
    import socket

    silent = socket.socket()
    silent.bind(("127.0.0.1", 0))
    silent.listen(8)  # takes connections, never answers
    try:
        for port in (free_port(), silent.getsockname()[1]):
            began = time.time()
            out = run_cli([*args, f"tracking.uri=http://127.0.0.1:{port}"], module=module)
            assert out.returncode == 2 and time.time() - began < 30, (port, time.time() - began)
            assert said(out.stderr) == [out.stderr.strip()] and "does not answer" in out.stderr, out.stderr[-2000:]
    finally:
        silent.close()


def test_a_pending_journal_entry_that_does_not_read_is_named_and_its_journal_still_replays(tmp_path, env):
    port, uri = _journaled_job(tmp_path, env)
    (entry,) = (tmp_path / "cache" / "journals").glob("*.json")
    entry.write_text('{"path": ')  # torn mid-write
    server = mlflow_server(tmp_path, port)
    try:
        plain = run_cli([], module="src.sync", env=env)
        lines = said(plain.stderr)
        assert plain.returncode == 1 and len(lines) == 1 and entry.name in lines[0] and "does not read" in lines[0]
        assert "Traceback" not in plain.stderr
        found = run_cli([str(tmp_path / "job"), f"tracking.uri={uri}"], module="src.sync", env=env)
        assert found.returncode == 0 and "1 journal(s) replayed" in found.stdout, found.stderr[-2000:]
        assert metric_counts(uri) == [("finished", 2)]
    finally:
        stop(server)


def test_a_store_left_half_made_is_made_anew_and_a_store_killed_while_made_opens(tmp_path, env):
    import sqlite3

    db = tmp_path / "m.db"
    with sqlite3.connect(db) as con:  # a first creation cut short: a table MLflow's migration makes, no runs
        con.execute("create table evaluation_datasets (dataset_id varchar(36))")
    out = run_cli([*QUICK, f"tracking.uri=sqlite:///{db}", f"hydra.run.dir={tmp_path / 'a'}"], env=env)
    assert out.returncode == 0 and "was left half-made" in out.stdout + out.stderr, out.stderr[-2000:]
    assert "Traceback" not in out.stderr and list(tmp_path.glob("m.db.half-made-*"))
    # a job killed while its new store is being made (and at other moments): the next run opens the store
    for delay in (0.3, 0.8, 1.5):
        fresh = tmp_path / f"k{delay}.db"
        proc = start([*QUICK, f"tracking.uri=sqlite:///{fresh}", f"hydra.run.dir={tmp_path / 'k'}"], tmp_path)
        time.sleep(delay)
        proc.kill()
        proc.wait()
        again = run_cli([*QUICK, f"tracking.uri=sqlite:///{fresh}", f"hydra.run.dir={tmp_path / 'k2'}"], env=env)
        assert again.returncode == 0 and "cannot open the tracking store" not in again.stderr, (
            delay,
            again.stderr[-2000:],
        )


def test_a_sync_stopped_midway_through_a_resend_resumes_and_the_job_ends_as_it_ended(tmp_path, env):
    """A finished job's journal, delivered once to a store whose file is then deleted (a fresh backend at the
    same address). `python -m src.sync` re-sends it there and is stopped (SIGTERM) after a few records; the next
    sync sends what the new run lacks, once, and the run ends FINISHED, never reaped as FAILED."""
    from src.tracking.store import journal
    from src.tracking.store.experiment import Store
    from src.tracking.store.jobrun import JobRun

    db = tmp_path / "m.db"
    uri = f"sqlite:///{db}"
    run = JobRun(
        Store(uri, "quantspec"), journal.Journal(tmp_path / "job", tmp_path / "registry", uri), uri, "quantspec"
    )
    run.start("job", None, {"a": "1"}, {"outcome": "running"}, "key")
    records = 400  # each its own store call: a re-send of seconds, long enough to stop midway
    for step in range(1, records + 1):
        run.log_metrics({"by_example/time_per_token_ms": float(step)}, step=step)
    run.set_tags({"outcome": "finished"})
    run.finish()
    db.unlink()
    path = tmp_path / "job" / "journal.jsonl"
    acks_before = path.read_text().count('"ack"')
    proc = subprocess.Popen(
        [sys.executable, "-m", "src.sync", str(tmp_path / "job"), f"tracking.uri={uri}"],
        cwd=ROOT, env=cli_env(env), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    deadline = time.time() + 120
    while path.read_text().count('"ack"') < acks_before + 5:  # the new run made, a few records in
        assert proc.poll() is None and time.time() < deadline, proc.communicate()
        time.sleep(0.01)
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 143 and "Traceback" not in err, err[-2000:]
    assert journal.unsettled(path) > 0  # stopped before the end: still owed
    resumed = run_cli([str(tmp_path / "job"), f"tracking.uri={uri}"], module="src.sync", env=env)
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    assert "already in the store" not in resumed.stdout and "record(s) replayed" in resumed.stdout
    (job,) = by_role(uri)[1]
    assert job.info.status == "FINISHED" and job.data.tags["outcome"] == "finished"
    history = MlflowClient(uri).get_metric_history(job.info.run_id, "by_example/time_per_token_ms")
    assert sorted(m.step for m in history) == list(range(1, records + 1))  # each once
    again = run_cli([str(tmp_path / "job"), f"tracking.uri={uri}"], module="src.sync", env=env)
    assert again.returncode == 0 and "already in the store" in again.stdout
