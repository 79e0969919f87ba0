"""llama.cpp beside quantspec, for the benchmark scripts: the users' jobs run whole and read back (decode, and
benchmark_long's prefill and time/token per prompt length), and llama.cpp (llama-cpp-python, a reference, not a
dependency) timed alike on the same GGUF and prompts."""

from __future__ import annotations

import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
from hydra import compose, initialize_config_dir
from mlflow.tracking import MlflowClient

from src.assembly.overrides import CONF_DIR
from src.common.environment import PROJECT_ROOT
from src.common.metrics import EXAMPLE
from src.common.say import say
from src.data.corpus import SEED_PROMPTS
from src.tracking.readback.compare import quiet
from src.tracking.readback.sweeps import sweep_jobs

TOKENS = 30  # the decode task's max_new_tokens


def _sweep(store: str, sweep_dir: Path, args: list[str], env: dict | None = None) -> list:
    """The runs of one `python -m src.run -m <args>` sweep into `sweep_dir` (whole jobs as a user runs them), read
    back from its store."""
    subprocess.run(
        [
            sys.executable,
            "-m",
            "src.run",
            "-m",
            *args,
            f"tracking.uri={store}",
            f"hydra.sweep.dir={sweep_dir}",
            "report_at_end=false",
        ],
        cwd=PROJECT_ROOT,
        check=True,
        capture_output=True,
        env={**os.environ, **(env or {})},
    )
    return sweep_jobs(store, sweep_id=str(sweep_dir.resolve()))[1]


def decode_job(store: str, sweep_dir: Path, overrides: list[str], env: dict | None = None) -> list:
    """The runs of one `python -m src.run -m task=decode <overrides>` sweep, read back from its store."""
    return _sweep(store, sweep_dir, ["task=decode", *overrides], env)


def quantize_job(store: str, sweep_dir: Path, overrides: list[str], env: dict | None = None) -> list:
    """The runs of one `python -m src.run -m task=quantize <overrides>` sweep, read back from its store."""
    return _sweep(store, sweep_dir, ["task=quantize", *overrides], env)


def llama_cpp_ms(llm, limit: int | None = None) -> float:
    """The median over the seed prompts (the first `limit` of them) of the time per token after the first,
    greedy."""
    per_prompt = []
    for prompt in SEED_PROMPTS[:limit]:
        llm.reset()
        times = [time.perf_counter() for _ in llm(prompt, max_tokens=TOKENS, temperature=0.0, stream=True)]
        per_prompt.append((times[-1] - times[0]) / max(len(times) - 1, 1) * 1000)
    return statistics.median(per_prompt)


def llama_bench(cache: Path) -> Path | None:
    """llama.cpp's llama-bench where scripts/build_llama_server puts it, or None after saying how to build it."""
    path = cache / "tools" / "llama.cpp" / "bin" / "llama-bench"
    if not path.is_file():
        say(f"no llama-bench at {path}: `bash scripts/build_llama_server` builds it (a few minutes)", err=True)
        return None
    return path


def llama_bench_ms(exe: Path, gguf: Path, threads: int) -> float:
    """llama-bench's tg figure as ms a token: TOKENS new tokens after an empty prompt, one repetition, timed by
    llama-bench itself (the C++ tool, without the Python binding's per-token calls)."""
    cmd = [str(exe), "-m", str(gguf), "-p", "0", "-n", str(TOKENS), "-r", "1", "-t", str(threads), "-o", "json"]
    done = subprocess.run(cmd, capture_output=True, text=True, check=True)
    return 1e3 / json.loads(done.stdout)[0]["avg_ts"]


def import_llama_cpp():
    """llama-cpp-python, or None after saying in one line how to install it."""
    try:
        import llama_cpp
    except ImportError:
        say("llama-cpp-python is not installed: `pip install llama-cpp-python` (builds llama.cpp)", err=True)
        return None
    return llama_cpp


def cache_dir() -> Path:
    """The jobs' cache directory, as the config composes it."""
    with initialize_config_dir(str(CONF_DIR), version_base="1.3"):
        return Path(str(compose("config").cache_dir)).expanduser()


def long_job(
    store: str, overrides: list[str], lengths: list[int], tokens: int, env: dict | None = None
) -> dict[int, tuple[float, float]]:
    """{prompt tokens: (prefill ms, time/token ms)} of one `python -m src.run -m task=benchmark_long <overrides>`
    job at these prompt lengths, `tokens` new tokens each (`env` added to its environment), read back from its
    store (the last quiet round)."""
    lengths_arg = f"task.prompt_lengths=[{','.join(map(str, lengths))}]"
    runs = _sweep(
        store,
        Path(tempfile.mkdtemp(prefix="bench-long-")),
        ["task=benchmark_long", lengths_arg, f"task.max_new_tokens={tokens}", *overrides],
        env,
    )
    # a round timed while other processes were busy is measured again (busy_reruns): the last quiet one counts
    job = quiet(runs)[-1]
    client = MlflowClient(store)
    history = {
        m: {h.step: h.value for h in client.get_metric_history(job.run_id, EXAMPLE + m)}
        for m in ("prompt_tokens", "prefill_ms", "time_per_token_ms")
    }
    return {
        int(t): (history["prefill_ms"].get(step, math.nan), history["time_per_token_ms"].get(step, math.nan))
        for step, t in history["prompt_tokens"].items()
    }


def llama_cpp_long(
    path: Path, lengths: list[int], threads: int, tokens: int, first: int, vocab: tuple[int, int]
) -> dict[int, tuple[float, float]]:
    """{prompt tokens: (prefill ms, time/token ms)} of llama.cpp on the GGUF at `path`: random prompts of ids in
    `vocab` after the `first` token, each prefilled in one call, then `tokens` single-token steps."""
    import llama_cpp as lc

    llm = lc.Llama(
        model_path=str(path),
        n_ctx=max(lengths) + tokens + 8,
        n_batch=512,
        n_ubatch=512,
        n_threads=threads,
        n_threads_batch=threads,
        verbose=False,
    )
    rng = np.random.default_rng(1)
    llm.reset()
    llm.eval([first] + rng.integers(*vocab, 31).tolist())  # warm-up, as the job's warm-up example
    out = {}
    for n in lengths:
        llm.reset()
        prompt = [first] + rng.integers(*vocab, n - 1).tolist()
        start = time.perf_counter()
        llm.eval(prompt)
        prefill = (time.perf_counter() - start) * 1000
        steps = []
        for _ in range(tokens):
            start = time.perf_counter()
            llm.eval([int(rng.integers(*vocab))])
            steps.append((time.perf_counter() - start) * 1000)
        out[n] = (prefill, statistics.median(steps))
    del llm
    return out
