"""Engines turn a prompt into tokens with a timestamp per token. Pure: models and tensors in, tokens
and timings out; never the config.

- `hf`: transformers' `generate`, the reference.
- `native`: quantspec's own loop over the model's forward and a KV cache (prefill, step, verify).
- other runtimes, each with its own export of the weights (src.engine.runtimes): `ort_genai`, `openvino`,
  `llamacpp`.
"""

import importlib
from functools import partial

from src.engine import native, speculative
from src.engine.config import ENGINES, STEP_PATHS
from src.engine.generation import Engine, Generation, Request, Sampling

# Each of quantspec's own engines' generate, by its kind: the engine's config class (src.engine.config.ENGINES)
# names its module.
GENERATE = {kind: importlib.import_module(ENGINES[kind].MODULE).generate for kind in ENGINES.names}


def engine_for(kind: str, step_path: str = "transformers", drafter=None, compile: bool = False, **draft):
    """The engine a task calls (src.engine.generation.Engine): (model, Request) -> Generation.
    native steps through the C++ step, the lean layer loop or the static step when asked (engine.step_path;
    `compile`: engine.compile, the static step's); with a drafter it decodes speculatively (`draft`: k,
    schedule, k_max)."""
    path = step_path if kind == "native" else "transformers"
    if drafter is not None:
        if kind != "native":
            raise ValueError("speculative decoding runs on the native engine")
        return partial(speculative.generate, drafter=drafter, path=path, compile=compile, **draft)
    return partial(native.generate, path=path, compile=compile) if path != "transformers" else GENERATE[kind]


__all__ = ["ENGINES", "GENERATE", "STEP_PATHS", "Engine", "Generation", "Request", "Sampling", "engine_for"]
