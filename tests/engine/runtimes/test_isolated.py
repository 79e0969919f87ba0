"""The export cache every runtime shares (src.engine.runtimes.exports: cached and cached_export): built once in a
scratch folder, kept while its manifest matches, and a failure is one line that leaves nothing behind."""

import os
import sys

import pytest

from src.engine.generation import Request
from src.engine.runtimes.exports import cached, cached_export
from src.models.tiny import tiny_model
from tests.support.cli import ROOT, cli_env


def test_an_export_is_built_once_and_a_failed_one_leaves_no_cache(tmp_path):
    calls = []

    def build(work):
        calls.append(work)
        (work / "model" / "weights.bin").write_text("w")

    out = tmp_path / "rt" / "key"
    assert cached(out, {"v": 1}, build, "test") == out and (out / "weights.bin").read_text() == "w"
    assert cached(out, {"v": 1}, build, "test") == out and len(calls) == 1  # cached
    assert cached(out, {"v": 2}, build, "test") == out and len(calls) == 2  # another manifest: rebuilt

    def fail(work):
        (work / "model" / "half.bin").write_text("h")
        raise RuntimeError("the test export failed: no")

    with pytest.raises(RuntimeError, match="^the test export failed: no$"):
        cached(tmp_path / "rt" / "other", {"v": 1}, fail, "test")
    # no scratch, no half cache: only the build locks stay (deleting an flock file another process may wait on is racy)
    assert sorted(p.name for p in (tmp_path / "rt").iterdir()) == [".key.lock", ".other.lock", "key"]


def test_an_exporter_process_that_fails_is_its_last_line(tmp_path):
    model, tok = tiny_model("llama")
    command = lambda work: [sys.executable, "-c", "import sys; print('a'); sys.exit('the builder said no')"]  # noqa: E731
    with pytest.raises(RuntimeError, match="^the Example export failed: the builder said no$"):
        cached_export(tmp_path / "x" / "key", {"v": 1}, model, tok, command, "Example")
    assert [p.name for p in (tmp_path / "x").iterdir()] == [".key.lock"]


def test_a_runtimes_process_answers_as_the_engine_and_says_its_errors_in_one_line():
    """src.engine.runtimes.isolated: calls and window_score forwarded; a Python error in the child is one line naming
    the runtime and when, with the child's traceback kept as a note."""
    from src.engine.runtimes.isolated import Isolated, Maker

    engine = Isolated(Maker("tests.support.crashing_runtime:Echo"), "echo")
    try:
        assert (
            engine(None, Request([[1, 2]], 3, False, None, None)) == ([[1, 2]], 3) and engine.window_score([5]) == 5.0
        )
    finally:
        engine.close()
    with pytest.raises(RuntimeError, match=r"^refusing failed on its load: ValueError: no model here\n") as err:
        Isolated(Maker("tests.support.crashing_runtime:Echo", fail=True), "refusing")
    assert "in the runtime's process" in "".join(err.value.__notes__)
    plain = Isolated(Maker("builtins:dict"), "plain")
    assert plain.scorer is None and engine.scorer is not None  # quality tasks fall back to torch's forward
    plain.close()


def test_what_crosses_to_a_runtimes_process_is_json_and_tensor_bytes_never_pickle():
    """src.engine.runtimes.wire: the engine's contract types, tensors of every dtype the runtimes return, paths and tuples
    come back equal; anything else is refused by the sender, in one line naming its type."""
    import io
    from multiprocessing.connection import Pipe
    from pathlib import Path

    import torch

    from src.engine.generation import Generation, Sampling
    from src.engine.runtimes import wire
    from src.engine.runtimes.isolated import Maker
    from src.quality.scoring import WindowScore

    value = (
        Generation(3, [5, 6], 1.25, [1.5, 1.75], 2.0),
        WindowScore(torch.randn(4), torch.arange(4), None),
        WindowScore(torch.randn(3), torch.arange(3), torch.randn(3, 2)),
        Sampling(do_sample=True, temperature=0.7, top_p=0.9, seed=3),
        {"ids": torch.tensor([[1, 2, 3]]), "half": torch.randn(2, 3).bfloat16(), "none": torch.empty(0, 4)},
        [Path("/a/b"), (1, 2.5, "x", None, True)],
        float("nan"),
    )
    a, b = Pipe()
    wire.send(a, value)
    back = wire.receive(b)
    assert back[0] == value[0] and back[3] == value[3] and back[5] == value[5] and back[6] != back[6]
    for got, want in zip(back[1:3], value[1:3]):
        assert torch.equal(got.target_logp, want.target_logp) and torch.equal(got.top1, want.top1)
    assert back[1].logp_at is None and torch.equal(back[2].logp_at, value[2].logp_at)
    for key in ("ids", "half", "none"):
        got, want = back[4][key], value[4][key]
        assert got.dtype == want.dtype and got.shape == want.shape and torch.equal(got, want)
    with pytest.raises(TypeError, match=r"a _io.BytesIO cannot cross to a runtime's process"):
        wire.send(a, {"file": io.BytesIO()})
    assert not b.poll(0)  # refused before anything was written
    with pytest.raises(TypeError, match=r"builtins.function cannot cross"):
        Maker("tests.support.crashing_runtime:Echo", lambda: 1)
    with pytest.raises(ValueError, match=r"'package.module:Name'"):
        Maker("tests.support.crashing_runtime.Echo")


def test_a_runtimes_process_stopped_or_wedged_fails_its_call_in_one_line_within_a_bound(monkeypatch):
    """SIGSTOP on the runtime's process mid-job: the call fails within seconds, naming what happened, and the
    process is ended; one that lives but uses no CPU (a deadlock) fails after the idle bound."""
    import signal
    import time

    from src.common import liveness
    from src.engine.runtimes.isolated import Isolated, Maker, RuntimeCrash

    engine = Isolated(Maker("tests.support.crashing_runtime:Echo"), "echo")
    os.kill(engine._proc.pid, signal.SIGSTOP)
    began = time.monotonic()
    with pytest.raises(RuntimeCrash, match=r"^echo's process was stopped \(SIGSTOP, or a debugger\) for over 5 s on "):
        engine(None, Request([[1, 2]], 3, False, None, None))
    assert time.monotonic() - began < liveness.STOPPED_S + 10 and engine._proc.poll() is not None
    monkeypatch.setattr(liveness, "IDLE_S", 2.0)
    engine = Isolated(Maker("tests.support.crashing_runtime:Sleeping"), "sleeper")
    with pytest.raises(RuntimeCrash, match=r"^sleeper's process used no CPU for 2 s \(wedged\) on its first decode"):
        engine(None, Request([[1, 2]], 3, False, None, None))
    assert engine._proc.poll() is not None


def test_a_calls_stop_rule_stays_in_the_job_and_is_asked_after_each_token():
    """The child asks the parent's stop rule (a tokenizer's, lm-eval's until) across the pipe; one that raises is
    the job's error, and the child, left waiting for its answer, is ended."""
    from src.engine.runtimes.isolated import Isolated, Maker

    engine = Isolated(Maker("tests.support.crashing_runtime:Counting"), "counting")
    asked = []

    def stop(new):
        asked.append(list(new))
        return len(new) == 3

    try:
        assert engine(None, Request([[1]], 10, False, None, None, stop=stop)) == [0, 1, 2]
        assert asked == [[0], [0, 1], [0, 1, 2]]
        assert engine(None, Request([[1]], 5, False, None, None)) == [0, 1, 2, 3, 4]  # no rule: none asked
        with pytest.raises(KeyError, match="broken rule"):
            engine(None, Request([[1]], 10, False, None, None, stop=lambda new: {}["broken rule"]))
        assert engine._proc.wait(timeout=10) == 0
    finally:
        engine.close()


def test_a_runtimes_process_dies_with_the_sweep(tmp_path):
    """SIGKILL the job's process: its runtime's process goes too (PR_SET_PDEATHSIG), leaving nothing running."""
    import signal
    import subprocess
    import sys
    import time

    import psutil

    script = (
        "from src.engine.runtimes.isolated import Isolated, Maker\nimport time\n"
        "e = Isolated(Maker('builtins:dict'), 'x')\nprint(e._proc.pid, flush=True)\ntime.sleep(120)\n"
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
