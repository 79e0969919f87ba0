"""quantspec's own CPU kernels: small-batch matmuls (gemv.cpp) for decode steps and draft verification,
a one-call RMSNorm (norm.cpp), and attention for a few new queries whose rows do not depend on how
many arrive together (attention.cpp).

`load(directory)` compiles them once per machine and torch version into `directory` (~30 s), loads
them as torch.ops.quantspec.*, and returns True. On a CPU without the instructions they use, or with
no compiler, it returns False and `reason()` says why: callers keep ATen's kernels.
"""

from __future__ import annotations

import hashlib
import os
import platform
from pathlib import Path

import torch

SOURCES = [Path(__file__).with_name(name) for name in ("gemv.cpp", "norm.cpp", "attention.cpp")]
HEADERS = [Path(__file__).with_name("dispatch.h")]
FLAGS = ["-O3", "-mavx512f", "-mavx512bw", "-mavx512vl", "-mavx512dq", "-mavx512bf16", "-mavx512vnni",
         "-mfma", "-fopenmp"]
CPU_FLAGS = ("avx512f", "avx512bw", "avx512vl", "avx512dq", "avx512_bf16", "avx512_vnni")
# Up to this many rows (a step, a verification of up to 15 drafts) these kernels run; above it (a
# prefill) ATen's blocked GEMMs win, as these re-read W per 6 rows. It must cover every verification:
# a row's result must not depend on how many rows come together, or a draft could change greedy output.
MAX_ROWS = 16

_state: dict[str, object] = {}


def _missing_cpu_flags() -> list[str]:
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return [f"/proc/cpuinfo (on {platform.system()})"]
    flags = set(next((line.split(":", 1)[1].split() for line in text.splitlines() if line.startswith("flags")), []))
    return [f for f in CPU_FLAGS if f not in flags]


def load(directory: Path) -> bool:
    """Build or load the kernels. The first answer is kept for the process."""
    if "ok" in _state:
        return bool(_state["ok"])
    reason = None
    missing = _missing_cpu_flags()
    if missing:
        reason = f"this CPU lacks {', '.join(missing)}"
    else:
        from torch.utils import cpp_extension
        key = hashlib.sha256(b"".join(p.read_bytes() for p in SOURCES + HEADERS) + " ".join(FLAGS).encode()
                             + torch.__version__.encode())
        build = Path(directory).expanduser() / f"gemv-{key.hexdigest()[:16]}"
        build.mkdir(parents=True, exist_ok=True)
        try:
            cpp_extension.load(name="quantspec_gemv", sources=[str(p) for p in SOURCES], extra_cflags=FLAGS,
                               extra_ldflags=["-fopenmp"], build_directory=str(build), is_python_module=False,
                               verbose=bool(os.environ.get("QUANTSPEC_VERBOSE_BUILD")))
        except Exception as err:  # no compiler or no ninja: a slower run, not a failed one
            last = str(err).strip().splitlines()
            reason = f"could not build src/kernels ({last[-1] if last else type(err).__name__})"
    _state["ok"], _state["reason"] = reason is None, reason
    return reason is None


def loaded() -> bool:
    """True once load() has succeeded in this process."""
    return bool(_state.get("ok"))


def reason() -> str | None:
    return _state.get("reason")  # type: ignore[return-value]
