"""What a measurement ran on: logged with every run, since timings mean nothing without it."""

from __future__ import annotations

import os
import platform
import subprocess
from importlib import metadata
from pathlib import Path

from src.common.mdtext import plain

PROJECT_ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("torch", "transformers", "mlflow", "hydra-core", "safetensors", "gguf", "accelerate")


def cpu_model() -> str:
    """The CPU's name as /proc/cpuinfo gives it; QUANTSPEC_CPU_NAME stands in for it where set (recorded
    as given, less bidi and control characters (src.common.mdtext.plain): tests run the whole suite under a long
    name to show that nothing depends on its length)."""
    if os.environ.get("QUANTSPEC_CPU_NAME"):
        return plain(os.environ["QUANTSPEC_CPU_NAME"])
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


# What the benchmark scripts append to (docs/benchmarks/results/*.jsonl): their output, not code, so a tree whose only
# change is a result just recorded is not "-dirty" (the next benchmark in a row would otherwise record itself so).
RESULTS_DIR = "docs/benchmarks/results"


def git_commit() -> str:
    """HEAD's commit, "-dirty" where a tracked file other than a benchmark result differs from it ("unknown"
    outside a git checkout)."""
    try:
        out = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=PROJECT_ROOT, capture_output=True, text=True, timeout=5, check=True
        )
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no", "--", ".", f":(exclude){RESULTS_DIR}"],
            cwd=PROJECT_ROOT,
            capture_output=True,
            text=True,
            timeout=5,
        ).stdout.strip()
        return out.stdout.strip() + ("-dirty" if dirty else "")
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def versions() -> dict[str, str]:
    found = {"python": platform.python_version()}
    for name in PACKAGES:
        try:
            found[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            found[name] = "absent"
    return found


RUNTIMES = ("numpy", "onnxruntime", "onnxruntime-genai", "openvino", "lm-eval", "llama-cpp-python")


def _read(path: str) -> str:
    try:
        return Path(path).read_text().strip()
    except OSError:
        return ""


def host_state() -> dict[str, str]:
    """What can change a figure on the same code, where this host lets it be read: the CPU frequency governor,
    turbo (boost), transparent huge pages, the kernel, the libraries' versions and the commit (with -dirty)."""
    governor = _read("/sys/devices/system/cpu/cpu0/cpufreq/scaling_governor") or "unreadable"
    no_turbo, boost = (
        _read("/sys/devices/system/cpu/intel_pstate/no_turbo"),
        _read("/sys/devices/system/cpu/cpufreq/boost"),
    )
    turbo = {"0": "on", "1": "off"}.get(no_turbo) or {"1": "on", "0": "off"}.get(boost) or "unreadable"
    thp = _read("/sys/kernel/mm/transparent_hugepage/enabled")
    thp = thp[thp.find("[") + 1 : thp.find("]")] if "[" in thp else (thp or "unreadable")
    state = {"governor": governor, "turbo": turbo, "thp": thp, "kernel": platform.release(), "commit": git_commit()}
    for name in (*PACKAGES, *RUNTIMES):
        try:
            state[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            pass  # absent: not installed here, nothing to compare
    state["python"] = platform.python_version()
    return state


def describe(threads: int, device: str) -> dict:
    import torch  # here, not at the top: scripts that set torch's ISA variables import this module first

    return {
        "cpu_model": cpu_model(),
        "cpu_count": os.cpu_count(),
        "threads": threads,
        "torch_threads": torch.get_num_threads(),
        "device": device,
        "platform": platform.platform(),
        "versions": versions(),
        "git_commit": git_commit(),
    }
