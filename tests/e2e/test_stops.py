"""Stops, with real processes: a signal sent to a running sweep (and one composition swallowed), a stop anywhere in a
sweep, a process killed outright whose runs the next one ends; a sweep stopped and rerun keeps what finished, reruns
a job whose config changed, and refuses a second process into it in one line.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time

import pytest
from mlflow.tracking import MlflowClient

from tests.support.cli import ROOT, cli_env, run_cli
from tests.support.faults import QUICK, SLOW, by_role, runs, said, start, wait_for


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
