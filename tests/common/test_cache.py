"""One verified cache (src.common.cache), as the converted models, quantized weights, references and runtime exports
use it: built once, kept while its manifest wants the same and every file is as built, rebuilt with its reason
otherwise; a failed or killed build leaves no cache, and the next build clears what a killed one left."""

import json

import pytest

from src.common.cache import MANIFEST, build_cached
from src.common.cache import damage as why_not


def write_files(out):
    (out / "weights.bin").write_bytes(b"\x01" * 1000)
    (out / "config.json").write_text("{}")


def test_cache_is_built_once(tmp_path):
    calls = []

    def build(out):
        calls.append(out)
        write_files(out)

    d = tmp_path / "model"
    build_cached(d, build, {"key": "k"})
    build_cached(d, build, {"key": "k"})
    assert len(calls) == 1 and why_not(d, {"key": "k"}) is None
    assert json.loads((d / MANIFEST).read_text())["files"]["weights.bin"]["bytes"] == 1000
    assert not list(tmp_path.glob(".model.*.tmp"))
    build_cached(d, build, {"key": "other"})  # built for other settings: rebuilt
    assert len(calls) == 2 and json.loads((d / MANIFEST).read_text())["want"] == {"key": "other"}


@pytest.mark.parametrize(
    "damage",
    [
        "flip",
        "truncate",
        "delete",
        "manifest",
        "manifest null",
        "files null",
        "entry null",
        "entry removed and weights truncated",
    ],
)
def test_damaged_cache_is_detected_and_rebuilt(tmp_path, damage):
    d = tmp_path / "model"
    build_cached(d, write_files, {})
    weights = d / "weights.bin"
    if damage == "flip":
        weights.write_bytes(b"\x01" * 999 + b"\x02")
    elif damage == "truncate":
        weights.write_bytes(b"\x01" * 10)
    elif damage == "delete":
        weights.unlink()
    elif damage == "manifest":
        (d / MANIFEST).write_text("{not json")
    elif damage == "manifest null":
        (d / MANIFEST).write_text("null")
    else:  # the manifest's own entries damaged (the cases), by hand or by a tool
        meta = json.loads((d / MANIFEST).read_text())
        if damage == "files null":
            meta["files"] = None
        elif damage == "entry null":
            meta["files"]["weights.bin"] = None
        else:
            del meta["files"]["weights.bin"]
            weights.write_bytes(b"\x01" * 10)
        (d / MANIFEST).write_text(json.dumps(meta))
    assert why_not(d, {}) is not None
    rebuilt = []
    build_cached(d, lambda out: (rebuilt.append(1), write_files(out)), {})
    assert rebuilt and why_not(d, {}) is None and weights.read_bytes() == b"\x01" * 1000


def test_failed_build_leaves_no_cache(tmp_path):
    d = tmp_path / "model"

    def explode(out):
        write_files(out)
        raise RuntimeError("conversion died")

    with pytest.raises(RuntimeError):
        build_cached(d, explode, {})
    # only the build lock stays (deleting an flock file while another process may wait on it is racy)
    assert not d.exists() and [p.name for p in tmp_path.iterdir()] == [".model.lock"]


def test_a_builder_killed_mid_build_leaves_nothing_behind_after_the_next_build(tmp_path):
    import os
    import signal
    import subprocess
    import sys
    import time

    from tests.support.cli import ROOT, cli_env

    d = tmp_path / "model"
    code = (
        f"import time\nfrom pathlib import Path\nfrom src.common.cache import build_cached\n"
        f"def build(out):\n    (out / 'half.bin').write_bytes(b'x' * 1000)\n    time.sleep(60)\n"
        f"build_cached(Path({str(d)!r}), build, {{'key': 'k'}})\n"
    )
    proc = subprocess.Popen([sys.executable, "-c", code], cwd=ROOT, env=cli_env())
    deadline = time.time() + 60
    while not list(tmp_path.glob(".model.*.tmp/model/half.bin")):
        assert proc.poll() is None and time.time() < deadline
        time.sleep(0.1)
    os.kill(proc.pid, signal.SIGKILL)  # no handler runs: its temporary directory stays
    proc.wait()
    assert list(tmp_path.glob(".model.*.tmp"))
    build_cached(d, write_files, {"key": "k"})
    assert why_not(d, {"key": "k"}) is None and not list(tmp_path.glob(".model.*.tmp"))
