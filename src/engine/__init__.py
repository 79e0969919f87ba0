"""Engines turn a prompt into tokens with a timestamp per token. Pure: models and tensors in, tokens
and timings out; never the config.

- `hf`: transformers' `generate`, the reference.
- `native`: quantspec's own loop over the model's forward and a KV cache (prefill, step, verify).
"""

from src.engine import hf, native
from src.engine.common import Generation, Sampling

ENGINES = {"hf": hf.generate, "native": native.generate}

__all__ = ["ENGINES", "Generation", "Sampling"]
