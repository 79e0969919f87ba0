"""A sweep across machines, for real: a two-node Ray cluster on this host (the head advertising hw-phx,
a second node hw-stx, one bench-slot each) and the lab's tracking server (scripts/tracking-server:
PostgreSQL + mlflow server with proxied artifacts) on loopback ports in a temporary directory.

Skipped, with what to install, where Ray or PostgreSQL is missing; CI installs both (scripts/setup).
The cluster is stopped with `ray stop --force`, which stops every Ray process on this host.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient

from tests.support.cli import ROOT, cli_env, run_process
from tests.support.processes import free_port, wait_healthy

RAY = Path(sys.executable).with_name("ray")
QUICK = ["model=tiny-llama", "task.limit=1", "task.max_new_tokens=2", "task.warmup=0", "engine.kernels=aten"]
SLOW = [
    "model=tiny-llama",
    "task.limit=3",
    "task.max_new_tokens=20",
    "task.min_time_s=1.5",  # each example timed for 1.5 s on any host: sized by time, not by a count of repeats
    "task.warmup=0",
    "engine.kernels=aten",
]

try:
    import ray  # noqa: F401

    NO_RAY = None
except ImportError:
    NO_RAY = "Ray is not installed: pip install -e '.[lab]'"
HAS_PG = any(Path("/usr/lib/postgresql").glob("*/bin/initdb")) if Path("/usr/lib/postgresql").is_dir() else False
try:
    import psycopg  # noqa: F401
except ImportError:
    HAS_PG = False
pytestmark = [
    pytest.mark.skipif(NO_RAY is not None, reason=NO_RAY or ""),
    pytest.mark.skipif(
        not HAS_PG, reason="PostgreSQL is not installed: apt-get install postgresql, pip install -e '.[lab]'"
    ),
]


CACHE = tempfile.mkdtemp(prefix="qs-cache-")  # the workers' (they take the env of `ray start`, not the driver's)


def _ray(*args: str) -> None:
    out = subprocess.run(
        [str(RAY), *args],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "RAY_USAGE_STATS_ENABLED": "0", "QUANTSPEC_CACHE": CACHE},
    )
    assert out.returncode == 0, out.stdout[-1500:] + out.stderr[-1500:]


@pytest.fixture(scope="module")
def cluster():
    """{'address', 'phx', 'stx'}: the cluster's address and its two nodes' ids."""
    port = free_port()
    temp = tempfile.mkdtemp(prefix="qs-ray-")  # short: Ray's socket paths must fit in 107 bytes
    common = ["--num-cpus=1", "--disable-usage-stats"]
    try:
        _ray(
            "start",
            "--head",
            f"--port={port}",
            "--include-dashboard=false",
            f"--temp-dir={temp}",
            "--resources",
            '{"hw-phx": 1, "bench-slot": 1}',
            *common,
        )
        _ray("start", f"--address=127.0.0.1:{port}", "--resources", '{"hw-stx": 1, "bench-slot": 1}', *common)
        nodes = {}
        deadline = time.time() + 60
        while len(nodes) < 2:
            assert time.time() < deadline, "the second node did not join"
            out = subprocess.run(
                [
                    sys.executable,
                    "-c",
                    (
                        f"import ray, json; ray.init(address={f'127.0.0.1:{port}'!r}, logging_level='ERROR'); "
                        "print(json.dumps({r: n['NodeID'] for n in ray.nodes() if n['Alive'] "
                        "for r in n['Resources'] if r.startswith('hw-')}))"
                    ),
                ],
                capture_output=True,
                text=True,
                timeout=60,
            )
            import json

            nodes = json.loads(out.stdout.strip().splitlines()[-1]) if out.returncode == 0 else {}
            time.sleep(0.5)
        yield {"address": f"127.0.0.1:{port}", "phx": nodes["hw-phx"], "stx": nodes["hw-stx"]}
    finally:
        subprocess.run([str(RAY), "stop", "--force"], capture_output=True, timeout=120)
        shutil.rmtree(temp, ignore_errors=True)
        shutil.rmtree(CACHE, ignore_errors=True)


@pytest.fixture(scope="module")
def server():
    """The tracking server as a lab starts it: scripts/tracking-server."""
    where = Path(tempfile.mkdtemp(prefix="qs-tracking-"))
    where.chmod(0o755)  # PostgreSQL runs as its own user (as root, the script hands it the data)
    port = free_port()
    proc = subprocess.Popen(
        ["bash", str(ROOT / "scripts" / "tracking-server"), "--port", str(port), "--dir", str(where)],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=cli_env({"PYTHON": sys.executable}),
    )
    uri = f"http://127.0.0.1:{port}"
    wait_healthy(uri, proc, "scripts/tracking-server")
    yield uri
    proc.send_signal(signal.SIGTERM)
    proc.wait(timeout=60)
    assert not list(where.glob("pg/postmaster.pid")), "PostgreSQL was left running"
    shutil.rmtree(where, ignore_errors=True)


def _jobs(uri: str, sweep: Path):
    from src.tracking.readback.sweeps import sweep_jobs

    client = MlflowClient(uri)
    parent_id, _ = sweep_jobs(uri, sweep_id=str(sweep.resolve()))
    exp = client.get_experiment_by_name("quantspec")
    children = client.search_runs([exp.experiment_id], filter_string=f"tags.mlflow.parentRunId = '{parent_id}'")
    return client, client.get_run(parent_id), children


def test_each_job_runs_on_a_node_with_its_hardware_and_lands_in_one_store(cluster, server, tmp_path):
    sweep = tmp_path / "sweep"
    args = [
        "-m",
        *QUICK,
        "hydra/launcher=ray",
        "hardware=phx,stx,hpt",
        "tracking=server",
        f"tracking.uri={server}",
        f"hydra.sweep.dir={sweep}",
    ]
    out = run_process(
        args, cwd=tmp_path, env={"RAY_ADDRESS": cluster["address"], "QUANTSPEC_CACHE": str(tmp_path / "c")}
    )
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    assert "2 finished, 1 skipped, 0 failed" in out.stdout
    assert not (tmp_path / "mlflow.db").exists()  # every node logged to the server
    client, parent, jobs = _jobs(server, sweep)
    by_hw = {j.data.tags["hardware"]: j for j in jobs}
    assert by_hw["phx"].data.tags["node"] == cluster["phx"] and by_hw["stx"].data.tags["node"] == cluster["stx"]
    assert by_hw["phx"].data.tags["node_host"] == socket.gethostname()
    assert by_hw["hpt"].data.tags["outcome"] == "skipped"
    assert by_hw["hpt"].data.tags["outcome_reason"] == "no node in the cluster offers hw-hpt"
    for hw in ("phx", "stx"):
        assert by_hw[hw].info.status == "FINISHED" and by_hw[hw].data.metrics["time_per_token_ms_median"] > 0
        assert "examples.md" in {a.path for a in client.list_artifacts(by_hw[hw].info.run_id)}  # proxied
    assert (parent.data.tags["jobs_finished"], parent.data.tags["jobs_skipped"]) == ("2", "1")
    # the same sweep again, on the cluster: what finished is kept, nothing is duplicated
    again = run_process(
        [a for a in args if a != "hardware=phx,stx,hpt"] + ["hardware=phx,stx"],
        cwd=tmp_path,
        env={"RAY_ADDRESS": cluster["address"], "QUANTSPEC_CACHE": str(tmp_path / "c")},
    )
    assert again.returncode == 0, again.stdout[-3000:] + again.stderr[-3000:]
    assert again.stdout.count("already finished in this sweep") == 2, [
        line.split("another config")[1][:400]
        for line in (again.stdout + again.stderr).splitlines()
        if "another config" in line
    ]
    assert len(_jobs(server, sweep)[2]) == 3


def test_without_a_server_or_a_cluster_the_sweep_stops_in_one_line(server, tmp_path):
    local = run_process(["-m", *QUICK, "hydra/launcher=ray", "hardware=phx,stx"], cwd=tmp_path)
    assert local.returncode == 2 and "needs one tracking server for every node" in local.stderr
    nowhere = run_process(
        [
            "-m",
            *QUICK,
            "hydra/launcher=ray",
            "hardware=phx,stx",
            "tracking=server",
            f"tracking.uri={server}",
            f"hydra.launcher.address=127.0.0.1:{free_port()}",
        ],
        cwd=tmp_path,
    )
    assert nowhere.returncode == 2 and "no Ray cluster answers at" in nowhere.stderr
    assert len([line for line in nowhere.stderr.splitlines() if line.startswith("quantspec:")]) == 1


def test_a_node_lost_mid_job_fails_that_job_and_the_sweep_goes_on(cluster, server, tmp_path):
    """Last in this module: it kills the stx node."""
    sweep = tmp_path / "sweep"
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "src.run",
            "-m",
            *SLOW,
            "hydra/launcher=ray",
            "hardware=phx,stx",
            "tracking=server",
            f"tracking.uri={server}",
            f"hydra.sweep.dir={sweep}",
        ],
        cwd=tmp_path,
        env=cli_env({"RAY_ADDRESS": cluster["address"], "QUANTSPEC_CACHE": str(tmp_path / "c")}),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    deadline = time.time() + 180
    while not any("example 1/" in p.read_text() for p in sweep.glob("*hardware=stx*/run.log")):
        assert time.time() < deadline and proc.poll() is None, "the stx job never started"
        time.sleep(0.2)
    raylet = subprocess.run(["pgrep", "-f", "static_resource_list=hw-stx"], capture_output=True, text=True)
    for pid in raylet.stdout.split():
        os.kill(int(pid), signal.SIGKILL)
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == 1, out[-3000:] + err[-3000:]
    summary = [line for line in (out + err).splitlines() if "quantspec:" in line]
    assert "1 finished, 0 skipped, 1 failed" in out, "\n".join(summary[-20:])
    _, parent, jobs = _jobs(server, sweep)
    by_hw = {j.data.tags["hardware"]: j for j in jobs}
    assert by_hw["phx"].info.status == "FINISHED"
    assert (
        by_hw["stx"].info.status == "FAILED"
        and "its node (hw-stx) was lost" in by_hw["stx"].data.tags["outcome_reason"]
    )
    assert (parent.data.tags["jobs_finished"], parent.data.tags["jobs_failed"]) == ("1", "1")
