"""What a measurement ran on: logged with every run, since timings mean nothing without it."""

from __future__ import annotations

import os
import platform
import subprocess
from importlib import metadata
from pathlib import Path

PROJECT_ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("torch", "transformers", "mlflow", "hydra-core", "safetensors", "gguf", "accelerate")


def cpu_model() -> str:
    """The CPU's name as /proc/cpuinfo gives it; QUANTSPEC_CPU_NAME stands in for it where set (recorded
    as given: tests run the whole suite under a long name to show that nothing depends on its length)."""
    if os.environ.get("QUANTSPEC_CPU_NAME"):
        return os.environ["QUANTSPEC_CPU_NAME"]
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def git_commit() -> str:
    try:
        out = subprocess.run(["git", "rev-parse", "HEAD"], cwd=PROJECT_ROOT, capture_output=True, text=True,
                             timeout=5, check=True)
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=PROJECT_ROOT,
                               capture_output=True, text=True, timeout=5).stdout.strip()
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


def describe(threads: int, device: str) -> dict:
    import torch   # here, not at the top: scripts that set torch's ISA variables import this module first
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
