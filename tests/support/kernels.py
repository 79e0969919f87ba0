"""The kernels' build directory, and a test's kernel variant loaded (or the test skipped, saying which instructions the
CPU lacks)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from src.assembly import schema  # noqa: F401 - the groups' schemas, which every composition is typed by

# The kernels' build directory of the runtime's own cache: built once per machine (CI compiles it for the tests and
# the main command); the kernel tests load each variant from it.
KERNELS = Path(os.environ.get("QUANTSPEC_CACHE", "~/.cache/quantspec")).expanduser() / "kernels"


def use_variant(name: str) -> str:
    """Load kernel variant `name` from KERNELS for this process: skipped, with the reason, where this CPU lacks its
    instructions; a failure where it cannot be built."""
    import torch

    from src import kernels
    from src.kernels import variants

    lacks = variants.missing(variants.by_name(name), variants.cpu_features())
    if lacks:
        pytest.skip(f"this CPU lacks {', '.join(lacks)}: the {name} kernels cannot run here")
    if not kernels.load_variants(KERNELS, [variants.by_name(name)]):
        pytest.fail(f"the {name} kernels could not be built: {kernels.reason()}")
    assert torch.ops.quantspec.variant() == name
    return name
