"""Whether another process of this host is still working, for every wait on one (a runtime's process, the
holder of a build lock): a process stopped (SIGSTOP, a debugger) for STOPPED_S, or one that used no CPU, nor
did any child it waited for, for IDLE_S, is not; the wait then gives up with that reason in one line
instead of waiting forever. Computing, compiling (its compiler's children) and reading files all use CPU."""

from __future__ import annotations

import time
from pathlib import Path

STOPPED_S = 5.0
IDLE_S = 300.0


def _stat(pid: int) -> tuple[str, int] | None:
    """(state, CPU ticks of the process and its waited-for children), or None when it is gone."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = text.rpartition(") ")[2].split()  # after the command name, which may hold spaces
    return fields[0], sum(int(f) for f in fields[11:15])  # utime, stime, cutime, cstime


class Watch:
    """One process's progress, judged at each `problem()` call."""

    def __init__(self, pid: int, stopped_s: float | None = None, idle_s: float | None = None):
        self.pid = pid
        self.stopped_s = STOPPED_S if stopped_s is None else stopped_s
        self.idle_s = IDLE_S if idle_s is None else idle_s
        self.stopped_since: float | None = None
        self.cpu: int | None = None
        self.busy_at = time.monotonic()

    def problem(self) -> str | None:
        """Why the process is not working (said as 'was stopped ...' or 'used no CPU ...'), or None: working,
        or gone (the waiter's own check says how it ended)."""
        now, found = time.monotonic(), _stat(self.pid)
        if found is None:
            return None
        state, cpu = found
        if state in "Tt":
            self.stopped_since = self.stopped_since or now
            if now - self.stopped_since > self.stopped_s:
                return f"was stopped (SIGSTOP, or a debugger) for over {self.stopped_s:g} s"
            return None
        self.stopped_since = None
        if cpu != self.cpu:
            self.cpu, self.busy_at = cpu, now
        elif now - self.busy_at > self.idle_s:
            return f"used no CPU for {self.idle_s:g} s (wedged)"
        return None
