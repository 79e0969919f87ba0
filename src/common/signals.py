"""Signals become an exception, so a stopped job or sweep ends its runs instead of vanishing, and a stop never
lands inside a write to the store or a journal.

SIGTERM (a scheduler, `kill`) and SIGHUP (a closed terminal) raise Stopped in the main thread, SIGINT (Ctrl-C)
KeyboardInterrupt. Both derive from BaseException, so no `except Exception` on the way up (Hydra's included)
mistakes a stop for a job failure. Once stopping has begun, further signals are ignored: the few store calls
that close the runs must not be cut short by an impatient second Ctrl-C.

Where a stop is raised matters. Raised inside an MLflow call it had left SQLite's write lock held by a session
that never ended (the runs' closing calls then waited 20 s each on "database is locked", and the job and the
sweep stayed RUNNING) and a journal's file closed under its own write. So a write runs `deferred()`: a stop that
arrives inside it is remembered and raised as the write's block ends, a few milliseconds later (a second stop
there is raised at once: a write that hangs must not hold the process).

A signal can also land while Python runs a weakref callback, a finalizer or a garbage collection: an exception
raised there is printed ("Exception ignored in: ...") and dropped, and the sweep went on. So a stop is remembered
before it is raised, a dropped one is raised again 10 ms later (the unraisable hook sets a one-shot timer whose
SIGALRM raises it: by then the interpreter is back in ordinary code, and should it land in a callback again, the
same happens again), and the loops check for one (`check`) at every job and every measured example. (Sending the
signal again from the hook does not do: its handler runs at once, inside the hook, where Python drops the
exception too.)
"""

from __future__ import annotations

import contextlib
import signal
import sys
import threading

CAUGHT = (signal.SIGTERM, signal.SIGHUP)


class Stopped(BaseException):
    def __init__(self, signum: int):
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


_pending: int | None = None  # the stop signal received, if any: set before it is raised, so none is lost
_owed = False  # a stop received inside a deferred block, to raise as the block ends
_depth = 0  # deferred blocks the main thread is in (a signal's handler runs only in the main thread)


def _stop(signum: int) -> BaseException:
    return KeyboardInterrupt() if signum == signal.SIGINT else Stopped(signum)


def _raise(signum, frame):
    global _pending, _owed
    again = _pending is not None
    _pending = signum
    if _depth and not again:
        _owed = True
        return
    raise _stop(signum)


@contextlib.contextmanager
def deferred():
    """A write that a stop must not cut in two (a store call, a journal line): a stop arriving inside is raised
    when the block ends. In a thread other than the main one (the heartbeat, the metrics sampler), a no-op."""
    global _depth, _owed
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    _depth += 1
    try:
        yield
    finally:
        _depth -= 1
        if not _depth and _owed:
            _owed = False
            raise _stop(_pending)


def check() -> None:
    """Raise the stop a signal asked for, where one was received and dropped (or not raised yet)."""
    if _pending is not None:
        raise _stop(_pending)


RETRY_S = 0.01


def _again(signum, frame):
    if _dropped_stop is not None:
        raise _dropped_stop


_dropped_stop: BaseException | None = None


def _dropped(unraisable) -> None:
    """sys.unraisablehook: a stop (or Ctrl-C) raised where Python drops exceptions is raised again RETRY_S later;
    the rest as Python reports them."""
    global _dropped_stop
    if isinstance(unraisable.exc_value, (Stopped, KeyboardInterrupt)):
        _dropped_stop = unraisable.exc_value
        signal.setitimer(signal.ITIMER_REAL, RETRY_S)
    else:
        sys.__unraisablehook__(unraisable)


def install() -> None:
    global _pending, _dropped_stop, _owed, _depth
    _pending = _dropped_stop = None
    _owed, _depth = False, 0
    for sig in (*CAUGHT, signal.SIGINT):
        if signal.getsignal(sig) is not signal.SIG_IGN:  # started ignoring it (a shell's `&` job): it stays so
            signal.signal(sig, _raise)
    signal.signal(signal.SIGALRM, _again)
    sys.unraisablehook = _dropped


def stopping() -> None:
    """From here on the process is ending: ignore further stop signals (and a dropped stop's retry); what the
    ending writes is not stopped again as its blocks end."""
    global _owed
    _owed = False
    signal.setitimer(signal.ITIMER_REAL, 0)
    for sig in (*CAUGHT, signal.SIGINT, signal.SIGALRM):
        signal.signal(sig, signal.SIG_IGN)


def describe(err: BaseException) -> tuple[str, int]:
    """(the reason, the exit code a shell expects: 128 + the signal number)."""
    if isinstance(err, Stopped):
        return f"stopped by {err}", 128 + err.signum
    return "stopped by SIGINT (Ctrl-C)", 128 + signal.SIGINT
