"""quantspec's own CPU kernels: small-batch matmuls (gemv.cpp) for decode steps and draft verification,
a one-call RMSNorm (norm.cpp), and attention for a few new queries whose rows do not depend on how
many arrive together (attention.cpp).

`load(directory)` compiles them once per machine and torch version into `directory` (~30 s), loads
them as torch.ops.quantspec.*, and returns True. On a CPU without the instructions they use, or with
no compiler, it returns False and `reason()` says why: callers keep ATen's kernels.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import platform
import shutil
from pathlib import Path

import torch

from src.locks import atomic_write_text, file_lock, sha256_file

log = logging.getLogger(__name__)
NAME = "quantspec_gemv"
RECORD = "library.json"   # the built library's sha256, checked before every load

SOURCES = [Path(__file__).with_name(name) for name in ("gemv.cpp", "norm.cpp", "attention.cpp")]
HEADERS = [Path(__file__).with_name(name) for name in ("dispatch.h", "simd.h")]
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
        key = hashlib.sha256(b"".join(p.read_bytes() for p in SOURCES + HEADERS) + " ".join(FLAGS).encode()
                             + torch.__version__.encode())
        build = Path(directory).expanduser() / f"gemv-{key.hexdigest()[:16]}"
        try:
            with file_lock(build.with_name(f".{build.name}.lock"), "the quantspec kernels"):
                _build_and_load(build)
        except Exception as err:  # no compiler or no ninja: a slower run, not a failed one
            last = str(err).strip().splitlines()
            reason = f"could not build src/kernels ({last[-1] if last else type(err).__name__})"
    _state["ok"], _state["reason"] = reason is None, reason
    return reason is None


def _build_and_load(build: Path) -> None:
    """Load the library only if its bytes are those recorded when it was built: a truncated or damaged
    .so can crash the process inside dlopen, before any Python error could say why. Anything else is
    wiped and built again (the caller holds the build lock)."""
    library, record = build / f"{NAME}.so", build / RECORD
    if library.is_file() and record.is_file():
        try:
            recorded = json.loads(record.read_text()).get("sha256")
        except json.JSONDecodeError:
            recorded = None
        if recorded == sha256_file(library):
            torch.ops.load_library(str(library))
            return
        log.warning("kernel library %s does not match its recorded sha256; rebuilding it", library)
    # Also clears torch's own build baton ("lock"), which a build killed midway leaves behind forever.
    shutil.rmtree(build, ignore_errors=True)
    build.mkdir(parents=True)
    from torch.utils import cpp_extension
    cpp_extension.load(name=NAME, sources=[str(p) for p in SOURCES], extra_cflags=FLAGS,
                       extra_ldflags=["-fopenmp"], build_directory=str(build), is_python_module=False,
                       verbose=bool(os.environ.get("QUANTSPEC_VERBOSE_BUILD")))
    atomic_write_text(record, json.dumps({"sha256": sha256_file(library), "torch": torch.__version__}))


def loaded() -> bool:
    """True once load() has succeeded in this process."""
    return bool(_state.get("ok"))


def reason() -> str | None:
    return _state.get("reason")  # type: ignore[return-value]
