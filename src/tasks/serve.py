"""task=serve: a server answers a load generator at one load level (task.concurrency, or task.request_rate), and
the job logs what the generator measured: output tokens and requests a second, TTFT, time per output token
(TPOT), the gaps between streamed tokens (ITL) and end-to-end latency at p50/p90/p99 (serve_* metrics).

task.server=quantspec: src.serving's server on this job's model, in this process, on a free loopback port
(continuous batching on the C++ step). The peers are processes of their own that end with the task:
- task.server=llama-server: llama.cpp's own server (`llama-server --parallel <concurrency>`) on the model's GGUF
  as shipped; its executable is QUANTSPEC_LLAMA_SERVER or the one scripts/build_llama_server puts in the cache;
- task.server=vllm: vLLM's CPU build (`--max-num-seqs <concurrency>`) on the model's float checkpoint at the
  precision's float dtype (bf16 for the quantized ones: vLLM's CPU build runs no quantspec format); its Python
  is QUANTSPEC_VLLM or the venv scripts/install_vllm puts in the cache.

task.base_url=http://host:port: a server already running, started by hand or elsewhere, measured as it is; none is
started, and the job's model gives only the tokenizer that aiperf counts tokens with (its precision and engine are
not the server's: the run is tagged server=external, and served_model with the model its requests named).

The load generator is aiperf (src.tasks.loadgen) on task.endpoint (completions or chat): task.prompts=synthetic
prompts of task.prompt_tokens, or =seeds (the seed prompts) or =dataset (dataset=jsonl's prompts: plain, OpenAI
messages, ShareGPT conversations; a conversation is sent as its messages, on the chat endpoint), in order, again
from the first when the requests outnumber them; task.output_tokens new tokens each (end of sequence ignored),
task.requests timed after task.warmup_requests. With task.slo_ttft_ms / slo_tpot_ms / slo_e2e_ms, goodput: the
requests a second that met every target given (serve_goodput_per_s), and their fraction (serve_good_fraction).
quantspec's own server keeps finished sequences' caches for prompts that begin alike (task.prefix_cache_mb,
src.engine.prefix_cache): the share of prompt tokens taken from it is serve_prefix_hit_fraction.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import signal
import socket
import subprocess
import tempfile
import time
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch

from src.common import envvars
from src.data.corpus import prompts as seed_prompts
from src.serving import http
from src.tasks import loadgen
from src.tasks.timed import TaskInputs, TaskResult

log = logging.getLogger(__name__)

SERVER_START_S = 120.0  # llama-server's model load and warm-up before /health answers
VLLM_START_S = 900.0  # vLLM compiles its graphs (torch.compile) at start: measured 5-10 minutes on 2 cores
LLAMA_SERVER = "llama-server"
MODEL = "quantspec"  # the model name requests carry where task.served_model names none (vLLM's served name too)


def run(inputs: TaskInputs) -> TaskResult:
    task = inputs.task
    exe = loadgen.aiperf(inputs.cache_dir)  # before the server: a missing load generator says so first
    with tempfile.TemporaryDirectory(prefix="quantspec-serve-") as work:
        work = Path(work)
        tokenizer = work / "tokenizer"
        inputs.tokenizer.save_pretrained(tokenizer)  # aiperf cuts its prompts to length with it, offline
        out, log_path = work / "aiperf", work / "aiperf.log"
        prompts = _prompts_file(inputs, work / "prompts.jsonl")
        try:
            with _server(inputs) as server:
                log.info("serve: %s at concurrency %d on %s", server.name, task.concurrency, server.url)
                cmd = loadgen.command(exe, server.url, task, tokenizer, out, server.model, prompts)
                loadgen.run(cmd, log_path, server.problem)
                summary = loadgen.results(out)
                _served_what_it_counts(server, summary)
                summary.update(server.figures())
            artifacts = {"aiperf.json": (out / "profile_export_aiperf.json").read_text()}
            if prompts is not None:  # read before the folder goes
                artifacts["serve_prompts.jsonl"] = prompts.read_text(encoding="utf-8")
        except loadgen.LoadGenError as err:  # the load generator's output outlives the folder: the job keeps it
            kept = _keep(inputs, out, log_path)
            raise loadgen.LoadGenError(f"{err} (kept: {kept})" if kept else str(err)) from None
    summary["serve_concurrency"] = float(task.concurrency)
    notes = []
    if task.base_url is not None:
        notes.append(
            f"measured {server.url} (model {server.model}) as it runs: this job's precision and engine are not its own"
        )
    elif task.server == "vllm":
        notes.append(f"vLLM served the float checkpoint at {_dtype(inputs)}, whatever the precision's own weights")
    if summary.get("serve_errors"):
        notes.append(f"{summary['serve_errors']:.0f} of the load generator's requests failed")
    return TaskResult([], summary, artifacts=artifacts, notes=notes, tags={"served_model": server.model})


def _prompts_file(inputs: TaskInputs, path: Path) -> Path | None:
    """task.prompts as aiperf's input file (None: its synthetic prompts)."""
    task = inputs.task
    if task.prompts == "synthetic":
        return None
    chosen = inputs.prompts if task.prompts == "dataset" else seed_prompts(inputs.code_model)
    if not chosen:
        raise loadgen.LoadGenError("task.prompts=dataset, but the job was given no prompts: add dataset=jsonl")
    return loadgen.prompts_file(chosen, task.endpoint == "chat", task.output_tokens, path)


@dataclass
class Served:
    """A server under load: its address, the model name its requests carry, `problem()` (how it died, or None
    while it serves) and, for quantspec's own, `answered()`: the requests it has answered whole."""

    url: str
    model: str
    name: str
    problem: Callable[[], str | None] = lambda: None
    answered: Callable[[], int] | None = None
    figures: Callable[[], dict[str, float]] = dict  # what the server itself counted (quantspec's prefix cache)


def _served_what_it_counts(server: Served, summary: dict) -> None:
    """The load generator's completed requests, checked against what quantspec's server itself answered (its
    warm-up requests included): a count it never served is no measurement."""
    if server.answered is None:
        return
    claimed, answered = summary.get("serve_requests", 0.0), server.answered()
    if claimed > answered:
        raise loadgen.LoadGenError(
            f"aiperf counts {claimed:.0f} completed requests, but the server answered {answered}: not recorded"
        )


def _keep(inputs: TaskInputs, out: Path, log_path: Path) -> str:
    """The load generator's log and export kept as the job's artifacts; their names, or "" where none was made."""
    kept = []
    for path, name in ((log_path, "aiperf.log"), (out / "profile_export_aiperf.json", "aiperf.json")):
        if path.is_file():
            inputs.keep_text(path.read_text(errors="replace")[-(1 << 20) :], name)
            kept.append(name)
    return ", ".join(f"the job's artifact {name}" for name in kept)


@contextlib.contextmanager
def _server(inputs: TaskInputs):
    if inputs.task.base_url is not None:
        yield _external(inputs.task)
        return
    server = {"quantspec": _quantspec, "llama-server": _llama_server, "vllm": _vllm}[inputs.task.server]
    with server(inputs) as served:
        yield served


def _external(t) -> Served:
    """A server already running at task.base_url: it must answer /v1/models now (one line where it does not), and
    the model its requests name is task.served_model, else the first it lists."""
    base = t.base_url.rstrip("/").removesuffix("/v1")
    try:
        with urllib.request.urlopen(f"{base}/v1/models", timeout=10) as r:
            listed = [m["id"] for m in json.loads(r.read()).get("data", []) if isinstance(m, dict) and "id" in m]
    except (OSError, ValueError, AttributeError) as err:
        raise loadgen.LoadGenError(
            f"task.base_url={t.base_url} did not answer GET /v1/models ({type(err).__name__}: {err}); start the "
            "server, or give the address it listens on"
        ) from None
    model = t.served_model or (listed[0] if listed else None)
    if model is None:
        raise loadgen.LoadGenError(f"{base}/v1/models lists no model: name the one to ask for with task.served_model")
    if listed and model not in listed:
        log.warning("task.served_model=%s is not among %s's models (%s); asking for it anyway", model, base, listed)
    return Served(base, model, "external")


@contextlib.contextmanager
def _quantspec(inputs: TaskInputs):
    t = inputs.task
    settings = http.Settings.of(t)
    name = t.served_model or MODEL
    app = http.App(inputs.model, inputs.tokenizer, name, inputs.max_context, settings)
    server = http.start(app, "127.0.0.1", 0)

    def problem() -> str | None:
        return None if app.loop.thread.is_alive() else "stopped batching (its loop's thread ended)"

    def figures() -> dict[str, float]:
        """The prefix cache's share of the prompt tokens asked for (warm-up requests' included), where it is on."""
        if app.prefixes is None:
            return {}
        stats = app.prefixes.stats
        return {"serve_prefix_hit_fraction": stats.hit_fraction(), "serve_prefix_hits": float(stats.hits)}

    try:
        yield Served(server.url(), name, "quantspec", problem, lambda: app.served, figures)
    finally:
        server.close()


def llama_server_path(cache_dir: Path) -> Path:
    """llama.cpp's server executable: QUANTSPEC_LLAMA_SERVER, or the cache's (scripts/build_llama_server)."""
    path = envvars.executable("QUANTSPEC_LLAMA_SERVER") or cache_dir / "tools" / "llama.cpp" / "bin" / LLAMA_SERVER
    if not path.is_file():
        raise loadgen.LoadGenError(
            f"no llama-server at {path}: run `bash scripts/build_llama_server` (a few minutes) or set "
            "QUANTSPEC_LLAMA_SERVER to one"
        )
    return path


@contextlib.contextmanager
def _llama_server(inputs: TaskInputs):
    t = inputs.task
    exe, gguf = llama_server_path(inputs.cache_dir), inputs.gguf()
    port = _free_port()
    cmd = [
        str(exe), "-m", str(gguf), "--host", "127.0.0.1", "--port", str(port),
        "--parallel", str(t.concurrency), "--ctx-size", str(_per_slot(t) * t.concurrency),
        "--threads", str(torch.get_num_threads()), "--no-webui",
    ]  # fmt: skip
    with _process("llama-server", cmd, port, SERVER_START_S, model=t.served_model or MODEL) as served:
        yield served


def vllm_python(cache_dir: Path) -> Path:
    """A Python that imports vLLM: QUANTSPEC_VLLM, or the cache's venv (scripts/install_vllm)."""
    path = envvars.executable("QUANTSPEC_VLLM") or cache_dir / "tools" / "vllm" / "bin" / "python"
    if not path.is_file():
        raise loadgen.LoadGenError(
            f"no vLLM at {path}: run `bash scripts/install_vllm` (its CPU build in a venv of its own, a few "
            "minutes) or set QUANTSPEC_VLLM to a Python that imports vllm"
        )
    return path


@contextlib.contextmanager
def _vllm(inputs: TaskInputs):
    t = inputs.task
    python, port = vllm_python(inputs.cache_dir), _free_port()
    cmd = [
        str(python), "-m", "vllm.entrypoints.openai.api_server", "--model", inputs.checkpoint(),
        "--served-model-name", t.served_model or MODEL, "--dtype", _dtype(inputs),
        "--host", "127.0.0.1", "--port", str(port),
        "--max-num-seqs", str(t.concurrency), "--max-model-len", str(_per_slot(t)),
    ]  # fmt: skip
    threads = str(torch.get_num_threads())
    # vLLM's CPU build takes its threads from OMP_NUM_THREADS (else it drops to one), its KV cache from
    # VLLM_CPU_KVCACHE_SPACE (GB; its default, 4, is more than a 270M model needs); the checkpoint is local
    env = {**os.environ, "OMP_NUM_THREADS": threads, "VLLM_CPU_KVCACHE_SPACE": "1", "HF_HUB_OFFLINE": "1"}
    with _process("vLLM", cmd, port, VLLM_START_S, env, model=t.served_model or MODEL) as served:
        yield served


def _dtype(inputs: TaskInputs) -> str:
    """The precision's float dtype (its float parts' under a quantized precision), as vLLM's --dtype names it."""
    return str(inputs.model.dtype).removeprefix("torch.")


def _per_slot(t) -> int:
    """The context one request holds: its prompt and new tokens, with room for the template's few."""
    return t.prompt_tokens + t.output_tokens + 16


@contextlib.contextmanager
def _process(name: str, cmd: list[str], port: int, start_s: float, env: dict | None = None, model: str = MODEL):
    """A server process of its own (its own session: it and its children end together), its output in a
    temporary log that its one-line failure is read from; yields it (Served) once /health answers, its problem()
    saying how it ended where it dies under the load."""
    log_file = tempfile.NamedTemporaryFile(prefix=f"{name}-", suffix=".log", delete=False)
    proc = subprocess.Popen(cmd, stdout=log_file, stderr=subprocess.STDOUT, start_new_session=True, env=env)

    def problem() -> str | None:
        if proc.poll() is None:
            return None
        return f"({name}) exited {proc.returncode}: {_last_line(log_file.name)}"

    try:
        _wait_ready(name, f"http://127.0.0.1:{port}/health", proc, log_file.name, start_s)
        yield Served(f"http://127.0.0.1:{port}", model, name, problem)
    finally:
        _end(proc)
        log_file.close()
        os.unlink(log_file.name)


def _wait_ready(name: str, url: str, proc: subprocess.Popen, log_path: str, start_s: float) -> None:
    deadline = time.monotonic() + start_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise loadgen.LoadGenError(f"{name} exited {proc.returncode} at start: {_last_line(log_path)}")
        try:
            with urllib.request.urlopen(url, timeout=2) as r:
                if r.status == 200:
                    return
        except OSError:
            pass
        time.sleep(0.5)
    raise loadgen.LoadGenError(f"{name} did not answer {url} within {start_s:.0f} s")


def _last_line(log_path: str) -> str:
    lines = [line for line in Path(log_path).read_text(errors="replace").splitlines() if line.strip()]
    return (lines[-1:] or ["?"])[0][:300]


def _end(proc: subprocess.Popen) -> None:
    """SIGTERM to the server's process group, SIGKILL if it is still there after 10 s."""
    if proc.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
