"""Processes a block of code started, ended with it when it is stopped: a kernel build's compilers must not
outlive a stopped sweep.

A stop (src.common.signals' Stopped, Ctrl-C's KeyboardInterrupt) raised while subprocess.run waits kills the
process it started, and only that one: ninja, or the compiler driver, whose own children (each compiler, cc1plus,
the assembler) are orphaned and go on for seconds on every core. They are no longer this process's children by
then, so the block's descendants are looked up as it runs (every POLL_S) and, when it ends with an exception,
each one still running is killed. psutil checks each one's start time before it signals, so a process id reused
since is never touched."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator

import psutil

POLL_S = 0.1  # a compiler lives for seconds: each is seen many times before a stop can orphan it


@contextlib.contextmanager
def ended_on_error() -> Iterator[None]:
    """Run the block; if it raises (a stop included), kill every process it started that still runs."""
    me = psutil.Process()
    before = {p.pid for p in _descendants(me)}
    seen: dict[int, psutil.Process] = {}
    done = threading.Event()

    def watch() -> None:
        while not done.wait(POLL_S):
            for p in _descendants(me):
                seen.setdefault(p.pid, p)

    watcher = threading.Thread(target=watch, name="quantspec-descendants", daemon=True)
    watcher.start()
    try:
        yield
    except BaseException:
        done.set()
        watcher.join()
        for p in _descendants(me):
            seen.setdefault(p.pid, p)
        for pid, p in seen.items():
            if pid not in before:
                with contextlib.suppress(psutil.Error):
                    p.kill()
        raise
    finally:
        done.set()


def _descendants(me: psutil.Process) -> list[psutil.Process]:
    try:
        return me.children(recursive=True)
    except psutil.Error:
        return []
