"""Engines turn a prompt into tokens with a timestamp per token. Pure: models and tensors in, tokens
and timings out; never the config.

- `hf`: transformers' `generate`, the reference.
- `native`: quantspec's own loop over the model's forward and a KV cache (prefill, step, verify).
"""

from functools import partial

from src.engine import hf, native
from src.engine.common import Generation, Sampling

ENGINES = {"hf": hf.generate, "native": native.generate}
STEP_PATHS = ("quantspec", "transformers")


def engine_for(kind: str, step_path: str = "transformers"):
    """The engine function a task calls; native steps through the lean layer loop when asked."""
    if kind == "native" and step_path == "quantspec":
        return partial(native.generate, fast=True)
    return ENGINES[kind]


__all__ = ["ENGINES", "STEP_PATHS", "Generation", "Sampling", "engine_for"]
