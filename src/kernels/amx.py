"""AMX's tiles for w8a8's many-row GEMM (core/amx.cpp): built and enabled where the CPU has them.

`enable(directory)` builds the AMX library once (beside the kernel variants, checked alike), asks Linux for the
tile state (arch_prctl(ARCH_REQ_XCOMP_PERM): a process must before its first tile instruction) and returns None
once `torch.ops.quantspec.int8_gemm_amx` may run, else the reason in one line: this CPU has no AMX, engine.isa
chose a narrower variant (a job timed as an AVX2 host runs), the compiler lacks -mamx-int8, or Linux refused. The caller keeps ATen's int8 GEMM then, and says so.
"""

from __future__ import annotations

from pathlib import Path

from src import kernels
from src.kernels import loader, variants

XTILEDATA = 18  # the tile data's state component (Linux's XFEATURE_XTILEDATA)


def missing(features: set[str] | None = None) -> list[str]:
    """The CPU flags this host lacks for AMX's int8 tiles (empty: it has them)."""
    return variants.missing(variants.AMX, variants.cpu_features() if features is None else features)


def enable(directory: Path, feature: int = XTILEDATA) -> str | None:
    """Build (once) and enable the AMX GEMM after quantspec's kernels are loaded (src.kernels.load). None when
    it is in use, else why not. `feature`: the state component asked for (only a test asks for another, to see
    Linux refuse)."""
    import torch  # after the ISA environment a script sets (see src.kernels.loader._key)

    if not kernels.loaded():
        return "quantspec's kernels are not loaded"
    lacks = missing()
    if lacks:
        return f"this CPU lacks {', '.join(lacks)}"
    if kernels.variant() != "avx512":  # engine.isa named a narrower variant: the job runs as that host would
        return f"engine.isa chose the {kernels.variant()} kernels; AMX goes with avx512's"
    if torch.ops.quantspec.amx():
        return None
    try:
        path = loader.built_variant(variants.AMX, Path(directory).expanduser())
    except Exception as err:  # an older compiler without -mamx-int8
        return str(err).strip().splitlines()[-1] if str(err).strip() else type(err).__name__
    return torch.ops.quantspec.use_amx(str(path), feature) or None


def enabled() -> bool:
    """Whether int8_gemm_amx may run in this process."""
    import torch  # after the ISA environment a script sets (see src.kernels.loader._key)

    return kernels.loaded() and bool(torch.ops.quantspec.amx())
