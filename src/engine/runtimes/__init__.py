"""Engines that are other runtimes, one package each (openvino/, ort_genai/, llamacpp/), with what they share:
the process an engine runs in (isolated.py, wire.py) and their exports' cache (exports.py, on src.common.cache). Each brings its own export of
the job's weights, quantization and kernels, and its module is a `Runtime` (src.engine.config), with:

- `TITLE`: the runtime's name in a failure line;
- `unsupported(cfg) -> str | None`: why it cannot run that job (the sweep records a skip with it);
- `runtime_name(cfg, device) -> str`: the runtime, its version and what it runs (param executed.runtime);
- `build(cfg, loaded, placement, corpus, recorder)`: its export built or cached, and a
  `src.engine.runtimes.isolated.Maker("package.module:Engine", folder, ...)` that makes the engine: the engine is
  made and run in a child process of its own (src.engine.runtimes.isolated; the maker's arguments cross as JSON,
  src.engine.runtimes.wire), so a crash of the runtime's native code is that job's failure with its reason, not the
  end of the sweep;
- `crash_hint() -> str`: what to do about a crash of its native code on this host, or "";
- the engine is an `Engine` (src.engine.generation: `engine(model, request)` -> Generation), and a `ScoringEngine`,
  with `window_score(ids, indices=None)`, where the runtime gives logits for every position: its logits reduced
  by src.quality.scoring.score_logits (perplexity, divergence from the reference, lm_eval).

Adding one is that module (anywhere importable: tests/support/example_runtime.py is one) and conf/engine/<name>.yaml with `kind: <name>` and `module: <its import
path>` (its config is then src.engine.config.RuntimeEngine: quantspec's own kernels, attention and step
path do not apply); nothing else lists the runtimes. A draft on any engine but native is refused when the config is read (drafts run on
quantspec's engine), so a runtime's `unsupported` never sees one.
"""

from __future__ import annotations

import importlib

from src.engine.config import Runtime


def runtime(engine) -> Runtime | None:
    """The module of an engine that is another runtime (engine.module), None for quantspec's own engines."""
    return importlib.import_module(engine.module) if engine.module else None
