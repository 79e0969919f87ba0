"""llama.cpp beside quantspec, for the benchmark scripts: the users' decode job run whole and read back, and
llama.cpp (llama-cpp-python, a reference, not a dependency) timed alike on the same GGUF and prompts."""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

from hydra import compose, initialize_config_dir

from src.assembly.overrides import CONF_DIR
from src.common.environment import PROJECT_ROOT
from src.common.say import say
from src.data.corpus import SEED_PROMPTS
from src.tracking.readback.sweeps import sweep_jobs

TOKENS = 30  # the decode task's max_new_tokens


def decode_job(store: str, sweep_dir: Path, overrides: list[str], env: dict | None = None) -> list:
    """The runs of one `python -m src.run -m task=decode <overrides>` sweep (a whole job as a user runs it),
    read back from its store."""
    subprocess.run(
        [
            sys.executable,
            "-m",
            "src.run",
            "-m",
            "task=decode",
            *overrides,
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


def llama_cpp_ms(llm, limit: int | None = None) -> float:
    """The median over the seed prompts (the first `limit` of them) of the time per token after the first,
    greedy."""
    per_prompt = []
    for prompt in SEED_PROMPTS[:limit]:
        llm.reset()
        times = [time.perf_counter() for _ in llm(prompt, max_tokens=TOKENS, temperature=0.0, stream=True)]
        per_prompt.append((times[-1] - times[0]) / max(len(times) - 1, 1) * 1000)
    return statistics.median(per_prompt)


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
