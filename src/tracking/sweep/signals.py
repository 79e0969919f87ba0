"""Signals become an exception, so a stopped job or sweep ends its runs instead of vanishing.

SIGTERM (a scheduler, `kill`) and SIGHUP (a closed terminal) raise Stopped in the main thread; Ctrl-C
already raises KeyboardInterrupt. Both derive from BaseException, so no `except Exception` on the way
up (Hydra's included) mistakes a stop for a job failure. Once stopping has begun, further signals are
ignored: the few store calls that close the runs must not be cut short by an impatient second Ctrl-C.
"""

from __future__ import annotations

import signal

CAUGHT = (signal.SIGTERM, signal.SIGHUP)


class Stopped(BaseException):
    def __init__(self, signum: int):
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


def _raise(signum, frame):
    raise Stopped(signum)


def install() -> None:
    for sig in CAUGHT:
        signal.signal(sig, _raise)


def stopping() -> None:
    """From here on the process is ending: ignore further stop signals."""
    for sig in (*CAUGHT, signal.SIGINT):
        signal.signal(sig, signal.SIG_IGN)


def describe(err: BaseException) -> tuple[str, int]:
    """(the reason, the exit code a shell expects: 128 + the signal number)."""
    if isinstance(err, Stopped):
        return f"stopped by {err}", 128 + err.signum
    return "stopped by SIGINT (Ctrl-C)", 128 + signal.SIGINT
