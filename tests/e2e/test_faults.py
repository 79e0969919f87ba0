"""Faults, with real processes: signals sent to a running sweep, a process killed outright, a tracking
server killed mid-job, two sweeps racing on one store and one cache, kernel builds killed, raced and
damaged, a full disk. Each test checks what the store holds afterwards and that nothing measured is lost.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient

from tests.helpers import (
    KERNELS,
    ROOT,
    cli_env,
    free_port,
    fresh_cache,
    kill_session,
    mlflow_server,
    overridden,
    run_cli,
    run_process,
)

# aten kernels: a fresh cache per test must not rebuild src/kernels (the kernel tests below do that)
QUICK = ["model=tiny-llama", "task.limit=2", "task.max_new_tokens=4", "task.warmup=0", "engine.kernels=aten"]
SLOW = [
    "model=tiny-llama",
    "task.limit=3",
    "task.max_new_tokens=20",
    "task.min_time_s=1.5",  # each example timed for 1.5 s on any host: sized by time, not by a count of repeats
    "task.warmup=0",
    "engine.kernels=aten",
]  # long enough to be stopped in the middle


def runs(uri: str) -> list:
    client = MlflowClient(uri)
    exp = client.get_experiment_by_name("quantspec")
    return client.search_runs([exp.experiment_id], max_results=1000) if exp else []


def by_role(uri: str) -> tuple[list, list]:
    found = runs(uri)
    return (
        [r for r in found if r.data.tags.get("quantspec.role") == "sweep"],
        [r for r in found if r.data.tags.get("quantspec.role") == "job"],
    )


def start(args: list[str], tmp_path: Path, name: str = "run", module: str = "src.run") -> subprocess.Popen:
    out, err = (tmp_path / f"{name}.out").open("w"), (tmp_path / f"{name}.err").open("w")
    # SIGINT as a terminal delivers it, whatever the suite was started under (a shell's `&` job ignores it,
    # and an ignored disposition is inherited: Python would then never raise KeyboardInterrupt)
    return subprocess.Popen(
        [sys.executable, "-m", module, *args],
        cwd=ROOT,
        stdout=out,
        stderr=err,
        env=cli_env({"QUANTSPEC_CACHE": str(fresh_cache(tmp_path / "cache"))}),
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )


def wait_for(path: Path, marker: str, proc: subprocess.Popen, timeout: float = 180) -> None:
    deadline = time.time() + timeout
    while marker not in path.read_text():
        assert proc.poll() is None, f"process ended before {marker!r}: {path.read_text()[-2000:]}"
        assert time.time() < deadline, f"no {marker!r} in {timeout} s"
        time.sleep(0.1)


def said(text: str) -> list[str]:
    return [line for line in text.splitlines() if line.startswith("quantspec:")]


@pytest.fixture
def env(tmp_path):
    return {"QUANTSPEC_CACHE": str(fresh_cache(tmp_path / "cache"))}


# --- signals ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "sig, code, words",
    [(signal.SIGTERM, 143, "stopped by SIGTERM"), (signal.SIGINT, 130, "stopped by SIGINT (Ctrl-C)")],
)
def test_a_signal_ends_the_job_and_the_sweep_as_killed_in_one_line(tmp_path, sig, code, words):
    uri = f"sqlite:///{tmp_path / 'm.db'}"
    proc = start(
        ["-m", *SLOW, "precision=fp32,bf16", f"tracking.uri={uri}", f"hydra.sweep.dir={tmp_path / 'sweep'}"], tmp_path
    )
    wait_for(tmp_path / "run.out", "example 1/", proc)
    sent = time.time()
    proc.send_signal(sig)
    assert proc.wait(timeout=30) == code
    assert time.time() - sent < 10
    err = (tmp_path / "run.err").read_text()
    assert len(said(err)) == 1 and words in said(err)[0] and "Traceback" not in err
    (parent,), (job,) = by_role(uri)
    assert job.info.status == "KILLED" and job.data.tags["outcome"] == "killed"
    reason = job.data.tags["outcome_reason"]
    assert reason.startswith(f"{words}; stopped after ") and reason.endswith(" of 3 examples (their rows are kept)")
    assert parent.info.status == "KILLED" and parent.data.tags["jobs_killed"] == "1"
    # what the job measured before the stop is kept: its config and environment, and each example it finished
    client = MlflowClient(uri)
    assert {"config.yaml", "environment.json"} <= {a.path for a in client.list_artifacts(job.info.run_id)}
    done = int(reason.split("stopped after ")[1].split()[0])
    assert done >= 1 and len(client.get_metric_history(job.info.run_id, "by_example/time_per_token_ms")) == done


def test_a_stop_that_composition_swallowed_is_still_the_stop(monkeypatch, tmp_path):
    """The stop-anywhere test's SIGTERM once landed inside Hydra's composition of the command line, which handed it
    back as a composition error (`defaults: ... (in the defaults entry's YAML)`, rc 2). A real SIGTERM here, taken
    while the command line is composed and lost there as Hydra lost it: the process still ends as stopped, 143."""
    from src import run

    def composing(args):
        try:
            os.kill(os.getpid(), signal.SIGTERM)  # the real handler (src.common.signals) raises Stopped here
            time.sleep(5)
        except BaseException:  # noqa: BLE001 - what Hydra's composition did with it: a config error instead
            return "defaults:  (in the defaults entry's YAML)"
        return None

    monkeypatch.setattr(run, "composition_problem", composing)
    out = run_cli([*QUICK, f"tracking.uri=sqlite:///{tmp_path / 'm.db'}"])
    assert out.returncode == 143 and len(said(out.stderr)) == 1 and "stopped by" in said(out.stderr)[0], out.stderr
    assert not (tmp_path / "m.db").exists()


def test_a_stop_anywhere_in_a_sweep_ends_it_in_one_line_and_leaves_nothing_running(tmp_path):
    """SIGTERM and SIGINT, in turns, at four points spread over a whole sweep's life (from the interpreter's imports to
    the report at its end), placed by fractions of the time one whole run of it took here: each ends the process
    in seconds, with 128 + the signal, in one line, and no run of the store is left RUNNING. Before: Ctrl-C while
    the imports loaded printed a KeyboardInterrupt traceback, and one landing inside a store call left SQLite's
    write lock held, so the closing calls failed after 40 s and the job and the sweep stayed RUNNING."""
    sweep = ["-m", "model=tiny-llama", "task.limit=2", "task.max_new_tokens=4", "task.warmup=0"]
    sweep += ["engine.kernels=aten", "precision=fp32,w8a8"]

    def run(name: str) -> tuple[subprocess.Popen, str]:
        uri = f"sqlite:///{tmp_path / name / 'm.db'}"
        (tmp_path / name).mkdir()
        return start(
            [*sweep, f"tracking.uri={uri}", f"hydra.sweep.dir={tmp_path / name / 'sweep'}"], tmp_path, name
        ), uri

    began = time.time()
    whole, _ = run("whole")
    assert whole.wait(timeout=300) == 0, (tmp_path / "whole.err").read_text()[-2000:]
    took = time.time() - began
    landed = 0
    # four points (the suite's time is bounded): the imports, a job loading, a job timing, the report at the end
    for i, fraction in enumerate((0.02, 0.35, 0.65, 0.92)):
        sig, code = (signal.SIGTERM, 143) if i % 2 == 0 else (signal.SIGINT, 130)
        # a run quicker than the one timed (a load on the host eased: seen in a suite beside other work) ends before
        # its signal; the point is tried once more, timed by that quicker run
        for attempt in range(2):
            name = f"at{i}-{attempt}"
            started = time.time()
            proc, uri = run(name)
            time.sleep(fraction * took)
            if proc.poll() is not None:
                took = min(took, time.time() - started)  # it ended within that sleep
                continue
            sent = time.time()
            proc.send_signal(sig)
            rc = proc.wait(timeout=60)
            err = (tmp_path / f"{name}.err").read_text()
            where = f"{sig.name} at {fraction:.0%} ({fraction * took:.1f} s): rc {rc}, {err[-1500:]}"
            if rc == 0:
                took = min(took, time.time() - started)  # it had finished its last write when the signal came
                continue
            landed += 1
            assert rc == code and time.time() - sent < 15, where
            assert "Traceback" not in err and len(said(err)) == 1 and "stopped by" in said(err)[0], where
            left = (
                [(r.data.tags.get("quantspec.role"), r.info.status) for r in runs(uri)]
                if (tmp_path / name / "m.db").exists()
                else []
            )
            assert not [r for r in left if r[1] == "RUNNING"], f"{where}; runs: {left}"
            break
    assert landed >= 3, f"only {landed} of 4 stops landed before the sweep ended (a whole run took {took:.1f} s)"


def test_a_killed_process_s_runs_are_ended_by_the_next_process(tmp_path, env):
    uri = f"sqlite:///{tmp_path / 'm.db'}"
    proc = start(
        ["-m", *SLOW, "precision=fp32,bf16", f"tracking.uri={uri}", f"hydra.sweep.dir={tmp_path / 'sweep'}"], tmp_path
    )
    wait_for(tmp_path / "run.out", "example 1/", proc)
    proc.kill()  # SIGKILL: no handler runs
    proc.wait(timeout=30)
    (parent,), (job,) = by_role(uri)
    assert parent.info.status == job.info.status == "RUNNING"
    out = run_cli([*QUICK, f"tracking.uri={uri}", f"hydra.run.dir={tmp_path / 'next'}"], env=env)
    assert out.returncode == 0, out.stderr[-2000:]
    sweeps, jobs = by_role(uri)
    left = next(j for j in jobs if j.info.run_id == job.info.run_id)
    assert left.info.status == "FAILED" and left.data.tags["outcome"] == "failed"
    assert "interrupted" in left.data.tags["outcome_reason"] and str(proc.pid) in left.data.tags["outcome_reason"]
    assert sweeps[0].info.status == "FAILED" and sweeps[0].data.tags["jobs_failed"] == "1"
    assert not [r for r in runs(uri) if r.info.status == "RUNNING"]


# --- resume ----------------------------------------------------------------------------------------


def test_rerunning_a_sweep_keeps_finished_jobs_and_reruns_the_rest(tmp_path, env):
    uri = f"sqlite:///{tmp_path / 'm.db'}"
    late, good = tmp_path / "late.txt", tmp_path / "good.txt"
    good.write_text("def f(x):\n    return x * 2\n" * 50)
    sweep = [
        "-m",
        *QUICK,
        "task=benchmark",
        "task.prompt_lengths=[8]",
        "dataset=textfile",
        f"dataset.path={late},{good}",
        f"tracking.uri={uri}",
        f"hydra.sweep.dir={tmp_path / 'sweep'}",
    ]
    first = run_cli(sweep, env=env)
    assert first.returncode == 1 and "1 finished, 0 skipped, 1 failed" in first.stdout
    late.write_text(good.read_text())
    second = run_cli(sweep, env=env)
    assert second.returncode == 0, second.stderr[-2000:]
    assert len([line for line in said(second.stdout) if "already finished in this sweep" in line]) == 1
    assert "2 finished, 0 skipped, 0 failed" in second.stdout
    (parent,), jobs = by_role(uri)
    assert len(jobs) == 3 and parent.data.tags["jobs_finished"] == "2" and parent.data.tags["jobs_failed"] == "0"
    from src.tracking.readback.sweeps import sweep_jobs

    assert len(sweep_jobs(uri, sweep_id=str((tmp_path / "sweep").resolve()))[1]) == 2  # latest attempts only
    forced = run_cli([*sweep, "resume=false"], env=env)
    assert forced.returncode == 0 and "already finished" not in forced.stdout
    assert len(by_role(uri)[1]) == 5 and by_role(uri)[0][0].data.tags["jobs_finished"] == "2"


# --- a tracking server that goes away ---------------------------------------------------------------


def _stop(proc: subprocess.Popen) -> None:
    os.killpg(proc.pid, signal.SIGKILL)  # the server and its workers, as a crash would
    proc.wait(timeout=30)


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
        _stop(server)
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
            _stop(server)


# --- concurrency -----------------------------------------------------------------------------------


def test_two_sweeps_at_once_share_neither_directory_nor_parent_and_build_once(tmp_path, env):
    uri = f"sqlite:///{tmp_path / 'fresh.db'}"  # a new store: both processes create its schema at once
    args = [sys.executable, "-m", "src.run", "-m", *QUICK, "precision=w8a8", f"tracking.uri={uri}"]
    procs = [
        subprocess.Popen(
            args, cwd=tmp_path, env=cli_env(env), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )
        for _ in range(2)
    ]
    outs = [p.communicate(timeout=300) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], [o[1][-1500:] for o in outs]
    assert len(list((tmp_path / "multirun").glob("*/*"))) == 2
    parents, jobs = by_role(uri)
    assert len(parents) == 2 and len(jobs) == 2 and all(j.data.tags["outcome"] == "finished" for j in jobs)
    assert {j.data.tags["mlflow.parentRunId"] for j in jobs} == {p.info.run_id for p in parents}
    built = [p.name for p in (tmp_path / "cache" / "quantized").iterdir() if not p.name.startswith(".")]
    assert len(built) == 1, built  # one build, no temporary leftovers


# --- the kernel library ----------------------------------------------------------------------------

LOAD = (
    "import sys; from pathlib import Path; from src import kernels; "
    "print('LOADED' if kernels.load(Path(sys.argv[1])) else kernels.reason())"
)


def test_kernel_builds_damaged_killed_and_raced_all_end_in_a_working_library(tmp_path):
    """A built cache is damaged (the binding truncated, as by a full disk or a killed copy; the variant's manifest
    JSON that is no manifest): the next load says so and starts again, and is killed while compiling, leaving its
    scratch folder (torch's baton, "lock", inside) behind; two loads then race: one builds, clearing the killed
    build's folder, the other waits, both load, and the variant is the same one, never a lesser. (The other damages
    go through the same check: tests/kernels/test_records.py, tests/common/test_cache.py.)"""
    from src import kernels
    from src.common.cache import MANIFEST, damage
    from src.kernels import variants

    # the session's build (made here if no test has made it yet), copied: only the damaged one is rebuilt
    ready = subprocess.run([sys.executable, "-c", LOAD, str(KERNELS)], cwd=ROOT, env=cli_env(), capture_output=True)
    assert ready.stdout.strip() == b"LOADED", ready.stderr[-2000:]
    best = kernels.candidates("auto")[0]  # the variant this CPU runs best, as a new process picks
    where = tmp_path / "kernels"
    built = [kernels.binding_folder(KERNELS), kernels.variant_folder(best, KERNELS, variants.compiler())]
    for folder in built:
        shutil.copytree(folder, where / folder.name, ignore=shutil.ignore_patterns(".*.lock"))
    (binding,) = where.glob("binding-*/quantspec_kernels.so")
    (variant,) = where.glob(f"*/qs_{best.name}.so")
    wants = {library: json.loads((library.parent / MANIFEST).read_text())["want"] for library in (binding, variant)}
    with binding.open("r+b") as f:
        f.truncate(binding.stat().st_size // 2)
    (variant.parent / MANIFEST).write_text("null")

    def load():
        return subprocess.Popen(
            [sys.executable, "-c", LOAD, str(where)],
            cwd=ROOT,
            env=cli_env(),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            start_new_session=True,  # a session of its own: the load and the compilers it started
        )

    first = load()
    deadline = time.time() + 60  # killed while compiling: its scratch folder, torch's baton inside, is left behind
    while not list(where.glob(".binding-*.tmp/model/lock")):
        assert time.time() < deadline and first.poll() is None, "the build never started"
        time.sleep(0.1)
    time.sleep(1)
    kill_session(first.pid)  # the load and the compilers it started (left running, they slow the racers)
    _, err = first.communicate()
    assert err.count("is rebuilt") == 1 and "quantspec_kernels.so has" in err, err
    assert list(where.glob(".binding-*.tmp"))
    racing = [load(), load()]
    errs = ""
    for proc in racing:
        out, err = proc.communicate(timeout=600)
        assert out.strip() == "LOADED", err[-2000:]
        errs += err
    # the variant's manifest, found by whichever racer took its lock first and rebuilt once
    assert errs.count(f"{variant.parent.name} is rebuilt: its manifest records no files") == 1, errs
    # the best variant, never a lesser, and the variants below it its missing kernels come from (core/api.h: on an
    # AVX2 host the reference alone; on an AVX-512 one, avx_vnni's or avx2's w2a16 first)
    below = {f"qs_{v.name}.so" for v in variants.fallbacks(best, variants.cpu_features())}
    assert "qs_reference.so" in below
    assert {p.name for p in where.glob("*/qs_*.so")} == {variant.name, *below} and "not built here" not in errs
    assert not list(where.glob(".*.tmp"))  # the killed build's folder cleared by the next build
    for library in (binding, variant):
        assert damage(library.parent, wants[library]) is None


# --- a full disk -----------------------------------------------------------------------------------


def _can_mount() -> bool:
    probe = (
        subprocess.run(["unshare", "-m", "sh", "-c", "mount -t tmpfs -o size=64k tmpfs /mnt"], capture_output=True)
        if shutil.which("unshare")
        else None
    )
    return bool(probe) and probe.returncode == 0


@pytest.mark.skipif(not _can_mount(), reason="needs `unshare -m` and tmpfs mounts (root in a mount namespace)")
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


# --- second round: a journal that never lies, resume by config, one process per sweep, store trouble ---


def _metric_counts(uri: str) -> list[tuple[str, int]]:
    client = MlflowClient(uri)
    return sorted(
        (j.data.tags.get("outcome", "?"), len(client.get_metric_history(j.info.run_id, "by_example/time_per_token_ms")))
        for j in by_role(uri)[1]
    )


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
        _stop(server)
        server = mlflow_server(second, port)  # the same address, an empty backend
        assert proc.wait(timeout=300) == 0, (tmp_path / "job.err").read_text()[-2000:]
        err = (tmp_path / "job.err").read_text()
        assert "journaled in" in err and "Traceback" not in err
        synced = run_cli([], module="src.sync", env=env)
        assert synced.returncode == 0 and "1 journal(s) replayed" in synced.stdout, synced.stdout + synced.stderr
        assert _metric_counts(uri) == [("finished", 2)]
        again = run_cli([str(tmp_path / "job"), f"tracking.uri={uri}"], module="src.sync", env=env)
        assert again.returncode == 0 and "already in the store" in again.stdout
        assert _metric_counts(uri) == [("finished", 2)]
        nothing = run_cli([], module="src.sync", env=env)  # nothing pending: exit 0
        assert nothing.returncode == 0 and "0 journal(s) replayed, 0 not" in nothing.stdout
    finally:
        _stop(server)


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
    assert _metric_counts(uri) == [("finished", 2)] * 3, synced.stdout
    (parent,), _ = by_role(uri)
    assert parent.data.tags["jobs_finished"] == "3"
    again = run_cli([str(sweep), f"tracking.uri={uri}"], module="src.sync", env=env)
    assert again.returncode == 0 and again.stdout.count("already in the store") == 3
    assert _metric_counts(uri) == [("finished", 2)] * 3


def test_a_job_whose_config_changed_is_rerun_on_resume(tmp_path, env):
    uri = f"sqlite:///{tmp_path / 'm.db'}"
    sweep = [
        "-m",
        *QUICK,
        "precision=fp32,bf16",
        f"tracking.uri={uri}",
        f"hydra.sweep.dir={tmp_path / 'sweep'}",
        "report_at_end=false",
    ]
    assert run_cli(sweep, env=env).returncode == 0
    kept = run_cli(sweep, env=env)
    assert kept.stdout.count("already finished in this sweep") == 2
    # conf/task/decode.yaml edited, the command line unchanged: a copy of conf/ with one default moved
    conf = tmp_path / "conf"
    shutil.copytree(ROOT / "conf", conf)
    decode = conf / "task" / "decode.yaml"
    decode.write_text(decode.read_text() + "\nrepeats: 2\n")
    moved = run_cli(["--config-path", str(conf), *sweep], env=env)
    assert moved.returncode == 0, moved.stderr[-2000:]
    reruns = [line for line in said(moved.stdout) if "with another config" in line]
    assert len(reruns) == 2 and all("(task.repeats: 1 -> 2); rerunning it" in line for line in reruns), reruns
    (parent,), jobs = by_role(uri)
    assert len(jobs) == 4 and len({j.data.params["config_hash"] for j in jobs}) == 4  # 2 jobs x 2 configs
    # the cache moving (another machine's, or QUANTSPEC_CACHE) is no change to what a job measures
    elsewhere = run_cli(["--config-path", str(conf), *sweep], env={**env, "QUANTSPEC_CACHE": str(tmp_path / "c2")})
    assert elsewhere.stdout.count("already finished in this sweep") == 2


def test_a_second_process_into_a_running_sweep_refuses_in_one_line(tmp_path, env):
    uri = f"sqlite:///{tmp_path / 'm.db'}"
    args = ["-m", *SLOW, "precision=fp32,bf16", f"tracking.uri={uri}", f"hydra.sweep.dir={tmp_path / 'sweep'}"]
    proc = start(args, tmp_path)
    try:
        wait_for(tmp_path / "run.out", "example 1/", proc)
        began = time.time()
        second = run_cli(args, env=env)
        assert second.returncode == 2 and time.time() - began < 30
        line = said(second.stderr)
        assert len(line) == 1 and f"is in use by pid {proc.pid}" in line[0] and "Traceback" not in second.stderr
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=60)
    # once the first has ended, the directory is free again: a rerun resumes it
    resumed = run_cli([*args[:1], *QUICK, "precision=fp32,bf16", *args[-2:], "report_at_end=false"], env=env)
    assert "is in use" not in resumed.stderr


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
    assert _metric_counts(uri) == [("finished", 2), ("finished", 2)]


def test_a_moved_journal_is_named_and_found_where_it_went(tmp_path, env):
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
    (tmp_path / "job").rename(tmp_path / "moved")
    server = mlflow_server(tmp_path, port)
    try:
        lost = run_cli([], module="src.sync", env=env)
        assert lost.returncode == 1 and "is listed as pending but is gone" in lost.stderr
        assert "python -m src.sync <its new folder>" in lost.stderr
        found = run_cli([str(tmp_path / "moved"), f"tracking.uri={uri}"], module="src.sync", env=env)
        assert found.returncode == 0 and "1 journal(s) replayed" in found.stdout
        assert _metric_counts(uri) == [("finished", 2)]
        assert run_cli([], module="src.sync", env=env).returncode == 0  # nothing listed any more
    finally:
        _stop(server)


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
        assert _metric_counts(uri) == [("finished", 2)]
    finally:
        _stop(server)


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


def _lock_dir(path: Path) -> bool:
    """Make a folder unwritable for whoever runs the test: chattr +i as root (root writes through modes)."""
    if os.geteuid() != 0:
        path.chmod(0o555)
        return True
    return subprocess.run(["chattr", "+i", str(path)], capture_output=True).returncode == 0


def _unlock_dir(path: Path) -> None:
    if os.geteuid() != 0:
        path.chmod(0o755)
    else:
        subprocess.run(["chattr", "-i", str(path)], capture_output=True)


def test_a_sweep_directory_made_unwritable_mid_sweep_ends_the_sweep_in_one_line(tmp_path, env):
    if os.geteuid() == 0 and shutil.which("chattr") is None:
        pytest.skip("running as root, a folder is made unwritable with chattr +i, and chattr is not installed")
    uri = f"sqlite:///{tmp_path / 'm.db'}"
    sweep = tmp_path / "sweep"
    proc = start(
        [
            "-m",
            *SLOW,
            "precision=fp32,bf16,w8a8",
            f"tracking.uri={uri}",
            f"hydra.sweep.dir={sweep}",
            "report_at_end=false",
        ],
        tmp_path,
    )
    wait_for(tmp_path / "run.out", "example 1/", proc)
    assert _lock_dir(sweep), "the sweep directory could not be made unwritable"
    try:
        code = proc.wait(timeout=300)
    finally:
        _unlock_dir(sweep)
    err = (tmp_path / "run.err").read_text()
    assert code == 1 and "Traceback" not in err, err[-3000:]
    lines = [line for line in said(err) if "could not write its files" in line]
    assert len(lines) == 1 and "sweep closed (1 finished" in lines[0] and f"hydra.sweep.dir={sweep}" in lines[0], err
    (parent,), jobs = by_role(uri)
    assert parent.info.status == "FAILED" and "could not write its files" in parent.data.tags["outcome_reason"]
    assert [j.data.tags["outcome"] for j in jobs] == ["finished"]  # the job under way when it happened: recorded


@pytest.mark.skipif(not _can_mount(), reason="needs `unshare -m` and tmpfs mounts (root in a mount namespace)")
def test_a_sweep_directory_on_a_full_disk_is_one_line_at_start_and_mid_sweep(tmp_path):
    """hydra.sweep.dir on a file system with no space: before any job, one line and no run; filled during
    the first job, that job is recorded, the sweep's parent is closed FAILED and the line says how to resume."""
    full, uri = tmp_path / "full", f"sqlite:///{tmp_path / 'm.db'}"
    full.mkdir()
    slow, quick = " ".join(SLOW), " ".join(QUICK)
    script = f"""
set -u
mount -t tmpfs -o size=2m tmpfs {full}
dd if=/dev/zero of={full}/fill bs=4k 2>/dev/null
{sys.executable} -m src.run -m {quick} precision=fp32,bf16 tracking.uri={uri} hydra.sweep.dir={full / "first"} \
    >{tmp_path / "first.out"} 2>{tmp_path / "first.err"}
echo "first rc=$?"
rm {full}/fill
{sys.executable} -m src.run -m {slow} precision=fp32,bf16,w8a8 tracking.uri={uri} hydra.sweep.dir={full / "sweep"} \
    report_at_end=false >{tmp_path / "sweep.out"} 2>{tmp_path / "sweep.err"} &
until grep -q "example 1/" {tmp_path / "sweep.out"} 2>/dev/null; do sleep 0.2; done
dd if=/dev/zero of={full}/fill bs=4k 2>/dev/null
wait $!
echo "sweep rc=$?"
"""
    out = subprocess.run(
        ["unshare", "-m", "bash", "-c", script],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
        env=cli_env({"QUANTSPEC_CACHE": str(fresh_cache(tmp_path / "cache"))}),
    )
    first = (tmp_path / "first.err").read_text()
    assert "first rc=1" in out.stdout and said(first) == [first.strip()], out.stdout + out.stderr + first
    assert "No space left on device" in first and "no job ran" in first
    err = (tmp_path / "sweep.err").read_text()
    assert "sweep rc=1" in out.stdout and "Traceback" not in err, out.stdout + err[-3000:]
    lines = [line for line in said(err) if "could not write its files" in line]
    assert len(lines) == 1 and "No space left on device" in lines[0] and "sweep closed (1 finished" in lines[0], err
    (parent,), jobs = by_role(uri)  # the first sweep made no run
    assert parent.info.status == "FAILED" and [j.data.tags["outcome"] for j in jobs] == ["finished"]


def test_a_complete_cache_made_read_only_is_used_as_it_is(tmp_path, env):
    if os.geteuid() == 0 and shutil.which("chattr") is None:
        pytest.skip("running as root, a folder is made read-only with chattr +i, and chattr is not installed")
    uri = f"sqlite:///{tmp_path / 'm.db'}"
    quick = [o for o in QUICK if not o.startswith("engine.kernels")]  # quantspec's kernels: cached too
    # the first job (here) fills the cache: kernels and quantized weights; the second is a real process, which loads
    # the kernels from the read-only cache as a new process on this machine would
    first = run_cli([*quick, "precision=w8a8", f"tracking.uri={uri}", f"hydra.run.dir={tmp_path / 'a'}"], env=env)
    assert first.returncode == 0, first.stderr[-2000:]
    cache = tmp_path / "cache"
    folders = [cache, *(p for p in cache.rglob("*") if p.is_dir())]
    if os.geteuid() == 0:
        locked = subprocess.run(["chattr", "-R", "+i", str(cache)], capture_output=True).returncode == 0
    else:
        for folder in folders:
            folder.chmod(0o555)
        locked = True
    assert locked
    try:
        again = run_process(
            [*quick, "precision=w8a8", f"tracking.uri={uri}", f"hydra.run.dir={tmp_path / 'b'}"], env=env
        )
    finally:
        if os.geteuid() == 0:
            subprocess.run(["chattr", "-R", "-i", str(cache)], capture_output=True)
        else:
            for folder in folders:
                folder.chmod(0o755)
    assert again.returncode == 0 and "Traceback" not in again.stderr, again.stderr[-3000:]
    assert "could not build" not in again.stdout + again.stderr and "Operation not permitted" not in again.stderr
    runs_ = runs(uri)
    assert len(runs_) == 2 and all(r.data.tags["outcome"] == "finished" for r in runs_)
    assert all(r.data.tags["kernels"] == "quantspec" for r in runs_)


# --- a runtime's exporter ----------------------------------------------------------------------------


def _alive(pid: int) -> bool:
    """A process that runs (a zombie waiting for whoever reaps orphans here is dead)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (FileNotFoundError, ProcessLookupError):
        return False


def test_a_killed_build_takes_its_exporter_with_it_and_the_next_build_clears_its_folder(tmp_path):
    """SIGKILL to a job mid-export: the exporter process (here one that would run for minutes) dies with it,
    and the next build of the same export clears the scratch folder the killed one left."""
    out, pids = tmp_path / "export", tmp_path / "exporter.pid"
    script = f"""
import sys
from pathlib import Path
from src.models.tiny import tiny_model
from src.engine.runtimes.exports import cached_export
model, tok = tiny_model("llama")
exporter = [sys.executable, "-c", "import os, time; open({str(pids)!r}, 'w').write(str(os.getpid())); time.sleep(600)"]
cached_export(Path({str(out)!r}), {{}}, model, tok, lambda work: exporter, "test")
"""
    job = subprocess.Popen([sys.executable, "-c", script], cwd=ROOT, env=cli_env({}))
    deadline = time.time() + 120
    while not (pids.is_file() and pids.read_text()) and job.poll() is None and time.time() < deadline:
        time.sleep(0.1)
    assert pids.is_file() and job.poll() is None, "the exporter never started"
    exporter = int(pids.read_text())
    (scratch,) = tmp_path.glob(".export.*.tmp")
    job.kill()
    job.wait(timeout=30)
    deadline = time.time() + 10
    while _alive(exporter) and time.time() < deadline:
        time.sleep(0.1)
    assert not _alive(exporter), "the exporter outlived the job that started it"
    from src.engine.runtimes.exports import cached_export
    from src.models.tiny import tiny_model

    model, tok = tiny_model("llama")
    made = cached_export(
        out,
        {},
        model,
        tok,
        lambda work: [sys.executable, "-c", f"open({str(work / 'model' / 'done')!r}, 'w')"],
        "test",
    )
    assert made == out and out.is_dir() and not scratch.exists()


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


def test_a_sweep_stopped_while_its_kernels_compile_leaves_no_compiler_running(tmp_path):
    """SIGTERM to the sweep alone (not its process group, as a scheduler's stop of the main process) while the
    kernels compile: the job ends killed, and every compiler the build started ends with it, not seconds later."""
    import psutil

    cache = tmp_path / "cache"  # no kernels: the job builds them
    proc = subprocess.Popen(
        [sys.executable, "-m", "src.run", *QUICK[:-1], f"tracking.uri=sqlite:///{tmp_path / 'm.db'}",
         f"hydra.run.dir={tmp_path / 'out'}", "report_at_end=false"],
        cwd=ROOT, env=cli_env({"QUANTSPEC_CACHE": str(cache)}), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        text=True, start_new_session=True,
    )  # fmt: skip
    me, compilers = psutil.Process(proc.pid), {}
    deadline = time.time() + 300
    try:
        while not compilers:  # a compiler proper (cc1plus), two levels below ninja or the driver
            assert proc.poll() is None and time.time() < deadline, proc.communicate()
            for p in me.children(recursive=True):
                with contextlib.suppress(psutil.Error):
                    if p.name() in ("cc1plus", "cc1", "as"):
                        compilers[p.pid] = p
            time.sleep(0.05)
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=120)
        ended = time.time()
        assert proc.returncode == 143 and "stopped by SIGTERM" in err, err[-2000:]

        def running():
            alive = []
            for p in compilers.values():
                with contextlib.suppress(psutil.Error):
                    if p.is_running() and p.status() != psutil.STATUS_ZOMBIE:
                        alive.append(p.name())
            return alive

        while running() and time.time() - ended < 1.0:
            time.sleep(0.05)
        assert not running(), f"compilers still running after the sweep ended: {running()}"
    finally:
        kill_session(proc.pid)


# --- quantization ----------------------------------------------------------------------------------


def test_a_quantization_killed_midway_resumes_at_its_next_layer_and_ends_as_an_uninterrupted_one(tmp_path):
    """SIGTERM while a 12-layer model is quantized (AWQ, then GPTQ on every linear): the job ends as killed in one
    line, its finished layers kept beside the cache; the same command then resumes at the first layer it had not
    written and the entry it makes is, file for file, the one an uninterrupted run makes."""
    args = ["model=llama-160m", "model.weights=random", "precision=w4a16", "precision.awq_grid=4",
            "precision.calib_samples=4", "precision.calib_seq_len=64", "task=quantize", "engine.kernels=aten"]  # fmt: skip
    runs_dir = tmp_path / "runs"
    proc = start([*args, f"hydra.run.dir={runs_dir / 'cut'}"], tmp_path, "cut")
    wait_for(tmp_path / "cut.out", "quantized layer 3 of 12", proc, timeout=300)
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=30) == 143
    err = (tmp_path / "cut.err").read_text()
    assert len(said(err)) == 1 and "stopped by SIGTERM" in said(err)[0] and "Traceback" not in err
    quantized = tmp_path / "cache" / "quantized"
    (partial,) = quantized.glob(".*.partial")
    assert not [p for p in quantized.iterdir() if not p.name.startswith(".")], "no entry from a partial"
    again = start([*args, f"hydra.run.dir={runs_dir / 'again'}"], tmp_path, "again")
    assert again.wait(timeout=600) == 0, (tmp_path / "again.err").read_text()[-2000:]
    log = (tmp_path / "again.out").read_text()
    assert "resuming the quantization" in log and "quantized layer 1 of 12 " not in log
    (entry,) = [p for p in quantized.iterdir() if not p.name.startswith(".")]
    whole_cache = tmp_path / "whole"
    whole = subprocess.run(
        [sys.executable, "-m", "src.run", *args, f"hydra.run.dir={runs_dir / 'whole'}"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        env=cli_env({"QUANTSPEC_CACHE": str(fresh_cache(whole_cache))}),
        timeout=600,
    )
    assert whole.returncode == 0, whole.stderr[-2000:]
    (reference,) = [p for p in (whole_cache / "quantized").iterdir() if not p.name.startswith(".")]
    names = sorted(p.name for p in reference.glob("*.safetensors"))
    assert names == sorted(p.name for p in entry.glob("*.safetensors")) and len(names) == 13
    for name in names:
        assert (entry / name).read_bytes() == (reference / name).read_bytes(), name
