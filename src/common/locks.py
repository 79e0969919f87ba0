"""Cross-process build locks, atomic files, the JSON records beside cached files, and file hashes.

Two jobs that need the same converted model, quantized weights or kernel library must give one build
and both finish. `flock` is the mechanism because the kernel drops the lock when its holder dies:
a killed build never leaves a lock that later jobs wait on forever (torch's own build baton does).
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import logging
import os
import socket
import time
from collections.abc import Iterator
from pathlib import Path

from src.common import liveness

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


class LockStuck(RuntimeError):
    """The process holding a lock lives but does not work (src.common.liveness); the message says which and
    what to do, in one line."""


def _holder_pid(holder: str) -> int | None:
    """The pid of a holder written as `pid N on HOST`, where HOST is this host."""
    words = holder.split()
    if len(words) == 4 and words[0] == "pid" and words[1].isdigit() and words[3] == socket.gethostname():
        return int(words[1])
    return None


@contextlib.contextmanager
def file_lock(path: Path, what: str) -> Iterator[None]:
    """Hold an exclusive lock on `path` (created if missing) for the block; `what` names what is waited for in the
    one line printed while another live process holds it. A holder on this host that is stopped or wedged
    ends the wait with LockStuck (a holder that dies releases the lock: the kernel drops it)."""
    fd, holder = _try_lock(path)
    try:
        if holder is not None:
            log.warning("waiting for %s (%s holds it)", what, holder)
            pid = _holder_pid(holder)
            watch = liveness.Watch(pid) if pid is not None else None
            while True:
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    break
                except BlockingIOError:
                    pass
                if watch is not None and (problem := watch.problem()) is not None:
                    raise LockStuck(
                        f"waiting for {what}: its holder, {holder}, {problem}; end it (kill {pid}) or let it go "
                        f"on (kill -CONT {pid}), then run again"
                    )
                time.sleep(0.2)
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


def read_record(path: Path) -> dict | None:
    """A cache's JSON record as the object it must be; None when it is missing, does not read, or holds
    anything else (`null`, a list, a string): the caller rebuilds what it describes, as for a missing one."""
    try:
        value = json.loads(path.read_text())
    except (OSError, ValueError):  # ValueError: not JSON, or not UTF-8
        return None
    return value if isinstance(value, dict) else None


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 22), b""):
            digest.update(block)
    return digest.hexdigest()
