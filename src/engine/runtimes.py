"""Engines that are other runtimes: each brings its own export of the job's weights, quantization and
kernels, and is one module with the same four names, registered here once:

- `unsupported(cfg) -> str | None`: why it cannot run that job (the sweep records a skip with it);
- `runtime_name(cfg, device) -> str`: the runtime, its version and what it runs (param executed.runtime);
- `build(cfg, loaded, placement, corpus, recorder)`: the engine callable, its export built or cached;
- the engine has `window_nll(ids)` where the runtime gives logits for every position (perplexity).

Adding one: a module with those, a line below, and conf/engine/<name>.yaml with `kind: <name>` and
`kernels: runtime` (quantspec's own kernels, attention and step path do not apply).
"""

from __future__ import annotations

import importlib

RUNTIMES = {"ort_genai": "src.engine.ort_genai", "openvino": "src.engine.openvino_engine"}


def runtime(kind: str):
    """The module of an engine that is another runtime, None for quantspec's and transformers' engines."""
    return importlib.import_module(RUNTIMES[kind]) if kind in RUNTIMES else None
