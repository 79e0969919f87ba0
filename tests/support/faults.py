"""What the fault tests (tests/e2e/test_*faults.py, test_stops.py) share: the quick and slow jobs they stop, a
sweep started as a real process, its store read back, a wait for what it printed, the host's mounts and locks."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

from mlflow.tracking import MlflowClient

from tests.support.cli import ROOT, cli_env, fresh_cache

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


def stop(proc: subprocess.Popen) -> None:
    os.killpg(proc.pid, signal.SIGKILL)  # the server and its workers, as a crash would
    proc.wait(timeout=30)


LOAD = (
    "import sys; from pathlib import Path; from src import kernels; "
    "print('LOADED' if kernels.load(Path(sys.argv[1])) else kernels.reason())"
)


def can_mount() -> bool:
    probe = (
        subprocess.run(["unshare", "-m", "sh", "-c", "mount -t tmpfs -o size=64k tmpfs /mnt"], capture_output=True)
        if shutil.which("unshare")
        else None
    )
    return bool(probe) and probe.returncode == 0


def metric_counts(uri: str) -> list[tuple[str, int]]:
    client = MlflowClient(uri)
    return sorted(
        (j.data.tags.get("outcome", "?"), len(client.get_metric_history(j.info.run_id, "by_example/time_per_token_ms")))
        for j in by_role(uri)[1]
    )


def lock_dir(path: Path) -> bool:
    """Make a folder unwritable for whoever runs the test: chattr +i as root (root writes through modes)."""
    if os.geteuid() != 0:
        path.chmod(0o555)
        return True
    return subprocess.run(["chattr", "+i", str(path)], capture_output=True).returncode == 0


def unlock_dir(path: Path) -> None:
    if os.geteuid() != 0:
        path.chmod(0o755)
    else:
        subprocess.run(["chattr", "-i", str(path)], capture_output=True)


def alive(pid: int) -> bool:
    """A process that runs (a zombie waiting for whoever reaps orphans here is dead)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (FileNotFoundError, ProcessLookupError):
        return False
