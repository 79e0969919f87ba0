"""The export cache every runtime shares (src.engine.runtimes.cached and cached_export): built once in a
scratch folder, kept while its manifest matches, and a failure is one line that leaves nothing behind."""

import sys

import pytest

from src.engine.runtimes import cached, cached_export
from src.models.tiny import tiny_model
from tests.conftest import ROOT, cli_env


def test_an_export_is_built_once_and_a_failed_one_leaves_no_cache(tmp_path):
    calls = []

    def build(work):
        calls.append(work)
        (work / "model").mkdir()
        (work / "model" / "weights.bin").write_text("w")

    out = tmp_path / "rt" / "key"
    assert cached(out, {"v": 1}, build, "test") == out and (out / "weights.bin").read_text() == "w"
    assert cached(out, {"v": 1}, build, "test") == out and len(calls) == 1  # cached
    assert cached(out, {"v": 2}, build, "test") == out and len(calls) == 2  # another manifest: rebuilt

    def fail(work):
        (work / "model").mkdir()
        raise RuntimeError("the test export failed: no")

    with pytest.raises(RuntimeError, match="^the test export failed: no$"):
        cached(tmp_path / "rt" / "other", {"v": 1}, fail, "test")
    assert sorted(p.name for p in (tmp_path / "rt").iterdir()) == ["key"]  # no scratch, no half cache


def test_an_exporter_process_that_fails_is_its_last_line(tmp_path):
    model, tok = tiny_model("llama")
    command = lambda work: [sys.executable, "-c", "import sys; print('a'); sys.exit('the builder said no')"]  # noqa: E731
    with pytest.raises(RuntimeError, match="^the Example export failed: the builder said no$"):
        cached_export(tmp_path / "x" / "key", {"v": 1}, model, tok, command, "Example")
    assert list((tmp_path / "x").iterdir()) == []


def test_a_runtimes_process_answers_as_the_engine_and_says_its_errors_in_one_line():
    """src.engine.isolated: calls and window_score forwarded; a Python error in the child is one line naming
    the runtime and when, with the child's traceback kept as a note."""
    from functools import partial

    from src.engine.isolated import Isolated
    from tests.crashing_runtime import Echo

    engine = Isolated(partial(Echo), "echo")
    try:
        assert engine(None, [[1, 2]], 3, False, None, None) == ([[1, 2]], 3) and engine.window_score([5]) == 5.0
    finally:
        engine.close()
    with pytest.raises(RuntimeError, match=r"^refusing failed on its load: ValueError: no model here\n") as err:
        Isolated(partial(Echo, fail=True), "refusing")
    assert "in the runtime's process" in "".join(err.value.__notes__)
    plain = Isolated(partial(dict), "plain")
    assert plain.window_score is None  # quality tasks fall back to torch's forward
    plain.close()


def test_a_runtimes_process_dies_with_the_sweep(tmp_path):
    """SIGKILL the job's process: its runtime's process goes too (PR_SET_PDEATHSIG), leaving nothing running."""
    import signal
    import subprocess
    import sys
    import time

    import psutil

    script = (
        "from functools import partial\nfrom src.engine.isolated import Isolated\nimport time\n"
        "e = Isolated(partial(dict), 'x')\nprint(e._proc.pid, flush=True)\ntime.sleep(120)\n"
    )
    parent = subprocess.Popen(
        [sys.executable, "-c", script], stdout=subprocess.PIPE, text=True, cwd=ROOT, env=cli_env()
    )
    child = int(parent.stdout.readline())
    assert psutil.pid_exists(child)
    parent.send_signal(signal.SIGKILL)
    parent.wait()
    deadline = time.time() + 10
    while time.time() < deadline and psutil.pid_exists(child) and psutil.Process(child).status() != "zombie":
        time.sleep(0.1)
    assert not psutil.pid_exists(child) or psutil.Process(child).status() == "zombie"
