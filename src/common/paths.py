"""Where quantspec keeps its cache, and paths built from user strings (model names, run names, sweep ids),
which stay inside their folders."""

from __future__ import annotations

import re
import tempfile
from pathlib import Path

from src.common import envvars


def cache_root() -> Path:
    """The cache's folder as the environment names it (`$QUANTSPEC_CACHE`, else ~/.cache/quantspec): what a
    command outside a job reads (sync's journal list, the store's locks, the kernel benchmark); a job reads
    its config's cache_dir, which defaults to the same."""
    return envvars.cache()


_UNSAFE = re.compile(r"[^A-Za-z0-9._+-]+")


def safe_component(text: str) -> str:
    """One path component: separators and other odd characters become '_', and no leading dot, so
    '..', '/x' or a hidden name can never be what a config or a run name turns into."""
    cleaned = _UNSAFE.sub("_", text).lstrip(".")
    return cleaned[:120] or "_"


def child(parent: Path, name: str) -> Path:
    """parent / safe_component(name), checked to resolve inside parent."""
    path = parent / safe_component(name)
    if not path.resolve().is_relative_to(parent.resolve()):
        raise ValueError(f"{name!r} would leave {parent}")
    return path


def unwritable(folder: Path, setting: str) -> str | None:
    """Why a command's output folder (`setting`, as the user wrote it) cannot be written, in one line, or None:
    made (with its parents) and probed now, before anything is read or computed."""
    try:
        folder.mkdir(parents=True, exist_ok=True)
        # a probe of this process's own: two commands probing one folder at once (two sweeps) must not remove
        # each other's
        with tempfile.NamedTemporaryFile(dir=folder, prefix=".quantspec-write-probe-"):
            pass
    except OSError as err:
        return (
            f"{setting} cannot be written ({err.strerror or type(err).__name__}: {folder}); name a folder you can write"
        )
    return None
