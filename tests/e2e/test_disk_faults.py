"""The sweep's own files' faults, with real processes: its directory made unwritable mid-sweep or on a full disk, a
complete cache made read-only.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

import pytest

from tests.support.cli import ROOT, cli_env, fresh_cache, run_cli, run_process
from tests.support.faults import QUICK, SLOW, by_role, can_mount, lock_dir, runs, said, start, unlock_dir, wait_for


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
    assert lock_dir(sweep), "the sweep directory could not be made unwritable"
    try:
        code = proc.wait(timeout=300)
    finally:
        unlock_dir(sweep)
    err = (tmp_path / "run.err").read_text()
    assert code == 1 and "Traceback" not in err, err[-3000:]
    lines = [line for line in said(err) if "could not write its files" in line]
    assert len(lines) == 1 and "sweep closed (1 finished" in lines[0] and f"hydra.sweep.dir={sweep}" in lines[0], err
    (parent,), jobs = by_role(uri)
    assert parent.info.status == "FAILED" and "could not write its files" in parent.data.tags["outcome_reason"]
    assert [j.data.tags["outcome"] for j in jobs] == ["finished"]  # the job under way when it happened: recorded


@pytest.mark.skipif(not can_mount(), reason="needs `unshare -m` and tmpfs mounts (root in a mount namespace)")
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
