"""Engines that are other runtimes, one package each (openvino/, ort_genai/, llamacpp/), with what they share:
the process an engine runs in (isolated.py, wire.py) and the export cache below (src.common.cache's). Each brings its own export of
the job's weights, quantization and kernels, and its module is a `Runtime` (src.engine.config), with:

- `unsupported(cfg) -> str | None`: why it cannot run that job (the sweep records a skip with it);
- `runtime_name(cfg, device) -> str`: the runtime, its version and what it runs (param executed.runtime);
- `build(cfg, loaded, placement, corpus, recorder)`: its export built or cached, and a
  `src.engine.runtimes.isolated.Maker("package.module:Engine", folder, ...)` that makes the engine: the engine is
  made and run in a child process of its own (src.engine.runtimes.isolated; the maker's arguments cross as JSON,
  src.engine.runtimes.wire), so a crash of the runtime's native code is that job's failure with its reason, not the
  end of the sweep;
- the engine has `window_score(ids, indices=None)` where the runtime gives logits for every position: its
  logits reduced by src.quality.scoring.score_logits (perplexity, divergence from the reference, lm_eval);
- optionally `TITLE` (the runtime's name in a failure line) and `crash_hint()` (what to do about a crash
  on this host, or "").

Adding one is that module (anywhere importable: tests/support/example_runtime.py is one) and conf/engine/<name>.yaml with `kind: <name>` and `module: <its import
path>` (its config is then src.engine.config.RuntimeEngine: quantspec's own kernels, attention and step
path do not apply); nothing else lists the runtimes. A draft on any engine but native is refused when the config is read (drafts run on
quantspec's engine), so a runtime's `unsupported` never sees one.
"""

from __future__ import annotations

import ctypes
import importlib
import logging
import signal
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

from src.common.cache import build_cached
from src.engine.config import Runtime

log = logging.getLogger("quantspec")


def runtime(engine) -> Runtime | None:
    """The module of an engine that is another runtime (engine.module), None for quantspec's own engines."""
    return importlib.import_module(engine.module) if engine.module else None


def cached(out: Path, want: dict, build: Callable[[Path], None], what: str) -> Path:
    """A runtime's export in `out`, built once and then cached (src.common.cache: kept while its manifest wants the
    same and each file is as built, rebuilt with one line saying why otherwise). `build(work)` writes the export
    into the empty folder `<work>/model` (and may use `work` as scratch), which replaces `out` once whole; a
    failure (its one-line RuntimeError) leaves no cache."""

    def timed(model: Path) -> None:
        started = time.perf_counter()
        build(model.parent)
        log.info("exported to %s in %.1f s", what, time.perf_counter() - started)

    return build_cached(out, timed, want, f"{what} export")


def cached_export(
    out: Path,
    want: dict,
    model,
    tokenizer,
    command: Callable[[Path], list[str]],
    what: str,
    files: dict[str, str] | None = None,
    env: dict | None = None,
) -> Path:
    """cached() for a runtime whose exporter is a process: the model written as a Hugging Face folder
    (`<work>/hf`, with `files` beside it), then `command(work)`, which writes `<work>/model`; its failure
    is the process's last line."""

    def build(work: Path) -> None:
        model.save_pretrained(work / "hf", safe_serialization=True)
        tokenizer.save_pretrained(work / "hf")
        for name, text in (files or {}).items():
            (work / name).write_text(text)
        # the exporter dies with this process (PR_SET_PDEATHSIG): a killed job leaves no orphan exporting
        done = subprocess.run(command(work), capture_output=True, text=True, env=env, preexec_fn=_die_with_parent)
        if done.returncode != 0:
            tail = [line for line in (done.stderr or done.stdout).strip().splitlines() if line.strip()][-1:]
            raise RuntimeError(f"the {what} export failed: {tail[0] if tail else done.returncode}")

    return cached(out, want, build, what)


def _die_with_parent() -> None:
    ctypes.CDLL(None).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


def exported(recorder, export: Callable[[], Path], kernels: str, executed: str) -> Path:
    """A runtime's export (built or cached) recorded as every runtime's is: metric export_s, param
    executed.kernels, tags kernels (quantspec's own kernel variant and note stay empty) and export."""
    started = time.perf_counter()
    path = export()
    recorder.log_metrics({"export_s": time.perf_counter() - started})
    recorder.log_params({"executed.kernels": executed})
    recorder.set_tags({"kernels": kernels, "kernels_isa": "", "kernels_note": "", "export": str(path)})
    return path
