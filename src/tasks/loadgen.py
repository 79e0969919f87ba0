"""The load generator task=serve drives a server with: NVIDIA's aiperf (PyPI `aiperf`), in a venv of its own under
the cache (its ~100 dependencies pinned apart from quantspec's; built once, about a minute, from PyPI), or the
one QUANTSPEC_AIPERF names.

Why aiperf: it measures what the issue's readers ask for in one run (TTFT, time per output token, each gap
between streamed chunks, end-to-end latency, output tokens a second, at p50/p90/p95/p99, and goodput: requests a
second that met every latency target given) at a fixed concurrency or a request rate, on the completions or the
chat endpoint, with synthetic prompts of a set token length cut from a tokenizer folder (offline) or the lines
of a prompts file, and writes them to one JSON file. guidellm wants a processor from the hub for synthetic data, inference-perf a Kubernetes-
style config; vLLM's `bench serve` would bring vLLM.
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

from src.common import envvars, liveness
from src.common.locks import file_lock

log = logging.getLogger("quantspec")

AIPERF = "aiperf==0.13.0"
CLOSED_LOOP_RATE = 100.0  # requests a second at most, where task.request_rate is null: a slot waits <= 10 ms
WATCH_S = 0.5  # how often a run's load generator and server are looked at


class LoadGenError(RuntimeError):
    """The load generator could not be set up or ended without results (the message is one line)."""


def aiperf(cache_dir: Path) -> Path:
    """aiperf's executable: QUANTSPEC_AIPERF, or the cache's venv (built now if missing)."""
    named = envvars.executable("QUANTSPEC_AIPERF")
    if named is not None:
        return named
    venv = cache_dir / "tools" / AIPERF.replace("==", "-")
    exe, done = venv / "bin" / "aiperf", venv / "quantspec-installed"
    with file_lock(cache_dir / "locks" / "aiperf-venv.lock", "aiperf's venv"):
        if not done.is_file():  # never finished (or never started): made afresh where it will stay
            log.warning("installing %s into %s (once, about a minute, from PyPI)", AIPERF, venv)
            shutil.rmtree(venv, ignore_errors=True)
            _make_venv(venv)
            done.write_text(AIPERF + "\n")
    return exe


def _make_venv(venv: Path) -> None:
    # a venv names its interpreter by its own path, so it is built where it stays; the marker, written last,
    # says it is whole
    uv = Path(sys.executable).parent / "uv"  # scripts/setup installs uv beside quantspec: ~4x faster than pip
    install = (
        [str(uv), "pip", "install", "-q", "--python", str(venv / "bin" / "python"), AIPERF]
        if uv.is_file()
        else [str(venv / "bin" / "pip"), "install", "-q", AIPERF]
    )
    steps = [[sys.executable, "-m", "venv", str(venv)], install]
    for step in steps:
        run = subprocess.run(step, capture_output=True, text=True)
        if run.returncode != 0:
            tail = (run.stderr or run.stdout).strip().splitlines()[-1:] or ["no output"]
            raise LoadGenError(f"could not install {AIPERF} into {venv} ({tail[0]}); pip needs PyPI once")


def command(
    exe: Path, url: str, task, tokenizer: Path, out: Path, model: str, prompts: Path | None = None
) -> list[str]:
    """aiperf's command line for one level of task=serve: synthetic prompts of task.prompt_tokens, or the lines of
    `prompts` (written by `prompts_file`), on task.endpoint."""
    cmd = [
        str(exe), "profile", "--model", model, "--url", url, "--endpoint-type", task.endpoint, "--streaming",
        "--concurrency", str(task.concurrency),
        "--request-count", str(task.requests), "--warmup-request-count", str(task.warmup_requests),
        "--output-tokens-mean", str(task.output_tokens), "--output-tokens-stddev", "0",
        "--extra-inputs", "ignore_eos:true", "--tokenizer", str(tokenizer),
        "--output-artifact-dir", str(out), "--random-seed", "1", "--no-auto-plot", "--ui-type", "none",
        # a new connection a request: a pooled one the server has closed while idle (llama-server does) failed
        # the next request sent on it ("server disconnected", 1-3 requests in 24)
        "--connection-reuse-strategy", "never",
    ]  # fmt: skip
    if prompts is None:
        cmd += ["--synthetic-input-tokens-mean", str(task.prompt_tokens), "--synthetic-input-tokens-stddev", "0"]
    else:  # the file's lines in order, again from the first when the requests outnumber them
        cmd += ["--input-file", str(prompts), "--custom-dataset-type", "single_turn"]
    slos = [f"{GOODPUT[name]}:{getattr(task, name):g}" for name in GOODPUT if getattr(task, name) is not None]
    if slos:  # a request is good where it meets every target given
        cmd += ["--goodput", " ".join(slos)]
    # A closed loop is paced at CLOSED_LOOP_RATE a second, capped at the concurrency: aiperf's concurrency mode alone
    # polls for a free slot without sleeping (measured: 66-90% of a core, on a 2-core host a third of the server's)
    rate = task.request_rate if task.request_rate is not None else CLOSED_LOOP_RATE
    return [*cmd, "--request-rate", str(rate)]


# task.slo_*: the aiperf metric each target is set on (its display unit, ms)
GOODPUT = {"slo_ttft_ms": "time_to_first_token", "slo_tpot_ms": "inter_token_latency", "slo_e2e_ms": "request_latency"}


def prompts_file(prompts: list, chat: bool, output_tokens: int, path: Path) -> Path:
    """The prompts as aiperf's single_turn lines, each asking for `output_tokens`: a plain prompt as its text; a
    conversation (only on the chat endpoint) as its whole `messages`, sent as they are, its last turn the text
    aiperf counts. Each item is a src.data.prompts.Prompt, or a str (a seed prompt)."""
    lines = []
    for p in prompts:
        text = p if isinstance(p, str) else p.text
        line: dict = {"output_length": output_tokens}
        if text is not None:
            line["text"] = text
        else:
            if not chat:
                raise ValueError("a conversation is served on the chat endpoint only")
            line["text"] = p.messages[-1][1]
            line["extra"] = {"messages": [{"role": role, "content": content} for role, content in p.messages]}
        lines.append(json.dumps(line))
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


# aiperf's metric -> (quantspec's metric stem, what it is)
METRICS = {
    "output_token_throughput": "output_tokens_per_s",
    "request_throughput": "requests_per_s",
    "time_to_first_token": "ttft_ms",
    "inter_token_latency": "tpot_ms",  # aiperf's per request: (end - first token) / (tokens - 1)
    "inter_chunk_latency": "itl_ms",  # each gap between streamed chunks
    "request_latency": "e2e_ms",
}
PERCENTILES = ("p50", "p90", "p95", "p99")


def run(cmd: list[str], log_path: Path, alive) -> None:
    """aiperf's run, watched as a runtime's process is (src.common.liveness): one stopped or wedged is ended, and
    so is one whose server died (`alive()`: a line saying how, or None while it serves); LoadGenError (one line)
    for each, and for a run that exits non-zero. Its output goes to `log_path`."""
    with open(log_path, "w") as log_file:
        proc = subprocess.Popen(cmd, stdout=log_file, stderr=subprocess.STDOUT, start_new_session=True)
        watch = liveness.Watch(proc.pid)
        try:
            while proc.poll() is None:
                problem = watch.problem()
                if problem is not None:
                    raise LoadGenError(f"aiperf {problem}; ended")
                died = alive()
                if died is not None:
                    raise LoadGenError(f"the server {died} during the load; nothing it served is recorded")
                time.sleep(WATCH_S)
        finally:
            if proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
    if proc.returncode != 0:
        lines = [line for line in log_path.read_text(errors="replace").splitlines() if line.strip()]
        raise LoadGenError(f"aiperf exited {proc.returncode}: {(lines[-1:] or ['?'])[0].strip()[:300]}")


def results(out: Path) -> dict[str, float]:
    """The serve_* metrics of aiperf's JSON export in `out`: each a finite, non-negative figure of requests that
    completed, or LoadGenError (one line) saying which is not. A level where no request completed has no
    latencies to give (aiperf then writes zeros): it fails, rather than record them as measured."""
    path = out / "profile_export_aiperf.json"
    if not path.is_file():
        raise LoadGenError(f"aiperf wrote no results ({path.name} missing); its log: {out / 'logs' / 'aiperf.log'}")
    try:
        data = json.loads(path.read_text(), parse_constant=float)  # NaN and Infinity as aiperf writes them
    except ValueError as err:
        raise LoadGenError(f"aiperf's {path.name} is not JSON ({err}); its run did not finish") from None
    completed = data.get("completed_request_count")
    if not isinstance(completed, dict) or not _figure(completed.get("avg")) or completed["avg"] < 1:
        raise LoadGenError("no request completed at this level: there is nothing to record as measured")
    got: dict[str, float] = {}
    for theirs, ours in METRICS.items():
        entry = data.get(theirs)
        if not isinstance(entry, dict):
            continue
        if ours.endswith("_per_s"):
            got[f"serve_{ours}"] = _checked(theirs, "avg", entry.get("avg"))
        else:
            for p in PERCENTILES:
                if entry.get(p) is not None:
                    got[f"serve_{ours}_{p}"] = _checked(theirs, p, entry[p])
    for theirs, ours in (
        ("completed_request_count", "serve_requests"),
        ("request_error_rate", "serve_error_pct"),
        ("goodput", "serve_goodput_per_s"),  # only where task.slo_* set targets
        ("good_request_fraction", "serve_good_fraction"),
    ):
        if isinstance(data.get(theirs), dict):
            got[ours] = _checked(theirs, "avg", data[theirs].get("avg"))
    errors = data.get("error_summary") or []
    got["serve_errors"] = float(sum(int(e.get("count", 0)) for e in errors if isinstance(e, dict)))
    return got


def _figure(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value) and value >= 0


def _checked(metric: str, stat: str, value) -> float:
    """A figure of aiperf's, or LoadGenError where it is none (NaN, infinite, negative, missing)."""
    if not _figure(value):
        raise LoadGenError(
            f"aiperf's {metric} {stat} is {value!r}, not a measurement (finite, at least 0); the level is not recorded"
        )
    return float(value)
