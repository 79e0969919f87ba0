"""Real processes a test starts: busy neighbours, a session killed whole, a free loopback port, a tracking server."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from src.assembly import schema  # noqa: F401 - the groups' schemas, which every composition is typed by


@contextlib.contextmanager
def spinning_neighbours(count: int = 1):
    """`count` processes spinning on a core each while the block runs: a neighbour on the host, as another user's
    work is. Not children of this process: a job run here counts its own children's CPU as its own (a runtime's
    process is its work), so a child of the test would not be a neighbour to it."""
    pids = []
    try:
        for _ in range(count):
            # the shell starts the spinner in the background and ends: the spinner is left to init, no child of ours
            out = subprocess.run(
                ["sh", "-c", f"'{sys.executable}' -c 'while True: pass' >/dev/null 2>&1 & echo $!"],
                capture_output=True,
                text=True,
                check=True,
            )
            pids.append(int(out.stdout.strip()))
        yield pids
    finally:
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


def kill_session(sid: int) -> None:
    """SIGKILL to every live process of session `sid` (a process started with start_new_session=True, and all it
    started), as a cancelled CI job or a closed terminal ends them. Its process group is not enough: ninja starts
    each compiler in a group of its own, and a compiler left running takes a core for half a minute."""
    import psutil

    while True:  # again until none is left: one may start another while the first ones are killed
        found = []
        for proc in psutil.process_iter(["status"]):
            with contextlib.suppress(psutil.Error, OSError):
                if proc.info["status"] != psutil.STATUS_ZOMBIE and os.getsid(proc.pid) == sid:
                    found.append(proc)
        if not found:
            return
        for proc in found:
            with contextlib.suppress(psutil.Error):
                proc.kill()
        psutil.wait_procs(found, timeout=5)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_healthy(url: str, proc: subprocess.Popen, what: str, timeout: float = 120) -> None:
    """Until `url`/health answers; bounded, so a server that never starts fails its test, not the suite."""
    deadline = time.time() + timeout
    while True:
        try:
            urllib.request.urlopen(f"{url}/health", timeout=2)
            return
        except OSError:
            if time.time() > deadline or proc.poll() is not None:
                proc.kill()
                pytest.fail(f"{what} did not start")
            time.sleep(0.3)


def mlflow_server(where: Path, port: int) -> subprocess.Popen:
    """A real `mlflow server` (with quantspec's view page: src.tracking.view.view_app) on loopback over a SQLite
    store in `where`, in its own process group
    (so a test can kill it with its workers, as a crash would), answering when this returns."""
    mlflow = os.path.join(os.path.dirname(sys.executable), "mlflow")
    backend = where / "server.db"
    if not backend.exists():  # MLflow's schema copied from the cached empty store, not migrated anew (~3 s);
        # the server makes its Default experiment on its first open, as on any new store
        from src.tracking.store.blank import empty_template

        template = empty_template()
        if template is not None:
            shutil.copyfile(template, backend)
    proc = subprocess.Popen(
        [
            mlflow,
            "server",
            "--app-name",
            "quantspec",
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--workers",
            "1",
            "--backend-store-uri",
            f"sqlite:///{backend}",
            "--artifacts-destination",
            str(where / "artifacts"),
        ],
        cwd=where,
        # no job-queue workers: MLflow starts seven (a Python process importing MLflow each, for GenAI jobs
        # quantspec never submits), as scripts/tracking-server also turns off
        env={**os.environ, "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    wait_healthy(f"http://127.0.0.1:{port}", proc, "mlflow server")
    return proc
