"""The environment variables quantspec reads, each parsed and checked in one place: a bad value is one line
naming the variable and what it takes, said when a command starts (check()) and never a traceback mid-run.

- QUANTSPEC_CACHE: the cache's folder (unset: ~/.cache/quantspec; set but empty is refused, not the working
  directory).
- QUANTSPEC_HEARTBEAT_S: how often a job tells its store it lives (seconds, 1 to 3600; unset: 30).
- QUANTSPEC_PREFETCH: l1 or l2, the cache level the kernels prefetch weights into (unset: chosen by the CPU).
- QUANTSPEC_AIPERF, QUANTSPEC_LLAMA_SERVER, QUANTSPEC_VLLM: task=serve's load generator, llama.cpp's server and
  a Python that imports vLLM, executables of one's own (unset: aiperf in a venv under the cache, built on first
  use; llama-server where scripts/build_llama_server puts it; vLLM's venv where scripts/install_vllm puts it).
"""

from __future__ import annotations

import math
import os
from pathlib import Path

DEFAULT_CACHE = "~/.cache/quantspec"
HEARTBEAT = ("QUANTSPEC_HEARTBEAT_S", 30.0, 1.0, 3600.0)  # name, unset, lowest, highest


class EnvError(ValueError):
    """An environment variable that is not one of its values; the message is the one line the user sees."""


def cache() -> Path:
    raw = os.environ.get("QUANTSPEC_CACHE")
    if raw is None:
        return Path(DEFAULT_CACHE).expanduser()
    if not raw.strip():
        raise EnvError(
            f"QUANTSPEC_CACHE is set but empty; unset it (the cache is then {DEFAULT_CACHE}) or name a folder"
        )
    return Path(raw).expanduser()


def seconds(name: str, default: float, low: float, high: float) -> float:
    raw = os.environ.get(name)
    if raw is None:
        return default
    try:
        value = float(raw)
    except ValueError:
        value = math.nan
    if not low <= value <= high:  # nan and inf fail here too
        raise EnvError(f"{name}={raw!r} must be a number of seconds from {low:g} to {high:g} (unset: {default:g})")
    return value


def heartbeat_s() -> float:
    return seconds(*HEARTBEAT)


def prefetch() -> str | None:
    raw = os.environ.get("QUANTSPEC_PREFETCH")
    if raw is None or raw == "":
        return None
    if raw.lower() not in ("l1", "l2"):
        raise EnvError(f"QUANTSPEC_PREFETCH={raw!r} must be l1 or l2 (unset: chosen by the CPU)")
    return raw.lower()


EXECUTABLES = ("QUANTSPEC_AIPERF", "QUANTSPEC_LLAMA_SERVER", "QUANTSPEC_VLLM")


def executable(name: str) -> Path | None:
    """The file an executable's variable names, or None where it is unset (or empty)."""
    raw = os.environ.get(name)
    if not raw:
        return None
    path = Path(raw).expanduser()
    if not path.is_file():
        raise EnvError(f"{name}={raw!r} is not a file; name the executable, or unset it")
    return path


def check() -> None:
    """Every variable above, at a command's start: EnvError for the first that is not one of its values."""
    cache()
    heartbeat_s()
    prefetch()
    for name in EXECUTABLES:
        executable(name)
