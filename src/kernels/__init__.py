"""quantspec's own CPU kernels: small-batch matmuls for decode steps and draft verification (fp32, bf16,
w8a8, w8a16, and the grouped low-bit formats of core/api.h), their unpacking for prefill, RMSNorm, and attention for a few new queries whose
rows do not depend on how many arrive together.

One library, several ISA variants (src/kernels/variants.py: avx512, avx_vnni, avx2, neon_dotprod, neon,
reference), each a plain shared library compiled from core/ with its own flags, behind one torch binding
(binding.cpp: torch.ops.quantspec.*; step.cpp: a whole decode step as one call, for src.engine.cpp_step).
`load(directory, isa)` builds what it needs once per machine and torch version into `directory`, picks
the best variant this CPU runs (or the one `isa` names), and returns True; `variant()` names the one in
use. With no compiler it returns False and `reason()` says why: callers keep ATen's kernels and must say
so. Forcing a variant this CPU cannot run raises IsaUnavailable, one line.
"""

from src.kernels.loader import (
    BINDING,
    MAX_ROWS,
    IsaUnavailable,
    binding_folder,
    binding_op,
    candidates,
    format_number,
    load,
    load_variants,
    loaded,
    reason,
    variant,
    variant_folder,
)

__all__ = [
    "BINDING",
    "MAX_ROWS",
    "IsaUnavailable",
    "binding_folder",
    "binding_op",
    "candidates",
    "format_number",
    "load",
    "load_variants",
    "loaded",
    "reason",
    "variant",
    "variant_folder",
]
