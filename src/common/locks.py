"""Cross-process build locks, atomic files and file hashes.

Two jobs that need the same converted model, quantized weights or kernel library must give one build
and both finish. `flock` is the mechanism because the kernel drops the lock when its holder dies:
a killed build never leaves a lock that later jobs wait on forever (torch's own build baton does).
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import logging
import os
import socket
from collections.abc import Iterator
from pathlib import Path

log = logging.getLogger(__name__)


def _try_lock(path: Path) -> tuple[int, str | None]:
    """(the open lock file, None) once this process holds its exclusive lock and has written itself in
    as the holder; or (the open file, who holds it) where another live process does."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return fd, os.pread(fd, 200, 0).decode(errors="replace").strip() or "another process"
    _claim(fd)
    return fd, None


def _claim(fd: int) -> None:
    os.ftruncate(fd, 0)
    os.pwrite(fd, f"pid {os.getpid()} on {socket.gethostname()}".encode(), 0)


@contextlib.contextmanager
def file_lock(path: Path, what: str) -> Iterator[None]:
    """Hold an exclusive lock on `path` (created if missing) for the block; `what` names the work in the
    one line printed while another live process holds it."""
    fd, holder = _try_lock(path)
    try:
        if holder is not None:
            log.warning("waiting for %s (%s is building it)", what, holder)
            fcntl.flock(fd, fcntl.LOCK_EX)
            _claim(fd)
        yield
    finally:
        os.close(fd)  # closing the descriptor releases the lock


def hold(path: Path) -> int | str:
    """Take an exclusive lock on `path` for the rest of this process (the descriptor is returned and
    left open); or, where another live process holds it, who that is."""
    fd, holder = _try_lock(path)
    if holder is not None:
        os.close(fd)
        return holder
    return fd


def atomic_write_text(path: Path, text: str) -> None:
    """Readers see the old file or the new one, never half of it."""
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    tmp.write_text(text)
    os.replace(tmp, path)


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 22), b""):
            digest.update(block)
    return digest.hexdigest()
