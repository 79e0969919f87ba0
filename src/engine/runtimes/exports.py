"""What every other runtime's export shares: built once and cached (src.common.cache), an exporter that is a process
of its own (dying with the job), and how the export is recorded on the job's run."""

from __future__ import annotations

import ctypes
import logging
import signal
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

from src.common.cache import build_cached

log = logging.getLogger("quantspec")


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
