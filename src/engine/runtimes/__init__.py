"""Engines that are other runtimes, one package each (openvino/, ort_genai/, llamacpp/), with what they share:
the process an engine runs in (isolated.py, wire.py) and the export cache below. Each brings its own export of
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
import json
import logging
import os
import shutil
import signal
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

from src.common.locks import sha256_file
from src.engine.config import Runtime

log = logging.getLogger("quantspec")


def runtime(engine) -> Runtime | None:
    """The module of an engine that is another runtime (engine.module), None for quantspec's own engines."""
    return importlib.import_module(engine.module) if engine.module else None


MANIFEST = "quantspec-export.json"


def damage(out: Path, want: dict) -> str | None:
    """Why the export in `out` cannot be used as it is (None: it can): no manifest, one that is not what this
    job wants, or a file whose size or sha256 is not the one recorded when it was built. A read-only but whole
    export passes: nothing here writes."""
    path = out / MANIFEST
    if not path.is_file():
        return "no manifest" if out.exists() else None
    try:
        manifest = json.loads(path.read_text())
    except (OSError, ValueError) as err:
        return f"its manifest does not read ({type(err).__name__})"
    if not isinstance(manifest, dict) or not isinstance(manifest.get("files"), dict) or not manifest["files"]:
        return "its manifest records no files (made before exports were checked, or damaged)"
    if manifest.get("want") != want:
        return "it was exported for other settings or versions"
    for name, entry in manifest["files"].items():
        file = out / name
        if not isinstance(entry, dict) or not file.is_file():
            return f"{name} is missing"
        if file.stat().st_size != entry.get("size") or sha256_file(file) != entry.get("sha256"):
            return f"{name} is not the file it exported (size or sha256 differs)"
    return None


def _clear_orphans(out: Path) -> None:
    """Scratch folders of earlier builds of `out` whose process is gone (a killed build leaves one)."""
    for work in out.parent.glob(f".{out.name}.*.tmp"):
        pid = work.name.removeprefix(f".{out.name}.").removesuffix(".tmp")
        try:
            os.kill(int(pid), 0)
        except ProcessLookupError:
            shutil.rmtree(work, ignore_errors=True)
        except (ValueError, PermissionError):
            pass  # not ours to judge: left alone


def cached(out: Path, want: dict, build: Callable[[Path], None], what: str) -> Path:
    """A runtime's export in `out`, built once and then cached: kept while its manifest holds `want` and each
    file's size and sha256 as built (src.engine.runtimes.damage), rebuilt with one line saying why otherwise.
    `build(work)` writes the export to `<work>/model` in a scratch folder beside `out`, which replaces
    `out` only once it is whole; a failure (its one-line RuntimeError) leaves no cache."""
    if out.is_dir():
        why = damage(out, want)
        if why is None:
            return out
        log.warning("the %s export in %s is rebuilt: %s", what, out, why)
    _clear_orphans(out)
    work = out.with_name(f".{out.name}.{os.getpid()}.tmp")
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    started = time.perf_counter()
    try:
        build(work)
    except BaseException:
        shutil.rmtree(work, ignore_errors=True)
        raise
    log.info("exported to %s in %.1f s", what, time.perf_counter() - started)
    files = {
        p.relative_to(work / "model").as_posix(): {"size": p.stat().st_size, "sha256": sha256_file(p)}
        for p in sorted((work / "model").rglob("*"))
        if p.is_file()
    }
    (work / "model" / MANIFEST).write_text(json.dumps({"want": want, "files": files}, indent=1))
    shutil.rmtree(out, ignore_errors=True)
    (work / "model").rename(out)
    shutil.rmtree(work, ignore_errors=True)
    return out


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
