"""Processes a block of code started, ended with it when it is stopped: a kernel build's compilers must not
outlive a stopped sweep.

A stop (src.common.signals' Stopped, Ctrl-C's KeyboardInterrupt) raised while subprocess.run waits kills the
process it started, and only that one: ninja, or the compiler driver, whose own children (each compiler, cc1plus,
the assembler) are orphaned and go on for seconds on every core. So while the block runs this process is their
subreaper (Linux's PR_SET_CHILD_SUBREAPER): an orphaned descendant becomes this process's child instead of
init's, where it can still be found, killed and reaped. Where that is not to be had, the block's descendants
are also looked up as it runs (every POLL_S), and those are killed. psutil checks each process's start time
before it signals, so a process id reused since is never touched."""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import os
import threading
import time
from collections.abc import Iterator

import psutil

POLL_S = 0.1
REAP_S = 5.0  # a killed process is gone within milliseconds; past this the stop goes on without waiting
PR_SET_CHILD_SUBREAPER = 36  # linux/prctl.h


def _subreaper(on: bool) -> bool:
    """Make this process the subreaper of its descendants (or stop being one); whether the kernel took it."""
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        return libc.prctl(PR_SET_CHILD_SUBREAPER, int(on), 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


@contextlib.contextmanager
def ended_on_error() -> Iterator[None]:
    """Run the block; if it raises (a stop included), kill every process it started that still runs."""
    me = psutil.Process()
    before = {p.pid for p in _descendants(me)}
    reaping = _subreaper(True)
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
        for p in _descendants(me):  # the orphans too, where this process reaps them
            seen.setdefault(p.pid, p)
        started = [p for pid, p in seen.items() if pid not in before]
        for p in started:
            with contextlib.suppress(psutil.Error):
                p.kill()
        _reap([p.pid for p in started])
        raise
    finally:
        done.set()
        if reaping:
            _subreaper(False)


def _reap(pids: list[int], within_s: float = REAP_S) -> None:
    """Wait for each killed process to be gone: reaped here where it is (or became) this process's child, else
    gone by its own parent's hand. A compiler's process is this process's child only once its driver is dead,
    so each is tried again until then."""
    left, deadline = set(pids), time.monotonic() + within_s
    while left and time.monotonic() < deadline:
        for pid in list(left):
            try:
                if os.waitpid(pid, os.WNOHANG)[0] == pid:
                    left.discard(pid)
            except ChildProcessError:  # not (yet) this process's child: gone, or still its dead parent's
                if not psutil.pid_exists(pid):
                    left.discard(pid)
        if left:
            time.sleep(0.01)


def _descendants(me: psutil.Process) -> list[psutil.Process]:
    try:
        return me.children(recursive=True)
    except psutil.Error:
        return []
