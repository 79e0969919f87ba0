"""Who owns a run, and whether that owner is gone.

Every run the pipeline opens records its owner: host, boot, process id and the process's start time
(a pid alone is reused). A run still RUNNING whose owner is gone was left by a process that no handler
could stop cleanly (SIGKILL, power loss, a lost node): the next quantspec process against the same
store ends it as interrupted. On this host the check is exact (/proc); for another host it falls back
to the run's heartbeat, which a live job refreshes every QUANTSPEC_HEARTBEAT_S seconds (30).
"""

from __future__ import annotations

import os
import socket
import time
from pathlib import Path

from src.common import envvars

STALE_HEARTBEATS = 10  # a run on another host this many heartbeats without one is taken as lost


def heartbeat_s() -> float:
    """Seconds between a job's heartbeats (QUANTSPEC_HEARTBEAT_S, checked: src.common.envvars)."""
    return envvars.heartbeat_s()


def _boot_id() -> str:
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        return "?"


def _start_ticks(pid: int) -> str | None:
    """The process's start time in clock ticks since boot, or None when no such process lives."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return None
    except OSError:
        return "?"
    # The command name (field 2) may hold spaces and parentheses: count fields after its last ')'.
    return stat.rsplit(")", 1)[1].split()[19]


def me() -> str:
    pid = os.getpid()
    return f"{socket.gethostname()}|{_boot_id()}|{pid}|{_start_ticks(pid) or '?'}"


def describe(owner: str) -> str:
    host, _, pid, _ = (owner.split("|") + ["?"] * 4)[:4]
    return f"pid {pid} on {host}"


def gone(owner: str | None, heartbeat_ms: str | None, now_s: float | None = None) -> str | None:
    """Why the owner of a RUNNING run is known to be gone, or None while it may still be running."""
    if not owner:
        return None  # a run from before owners were recorded: nothing to judge it by
    host, boot, pid, start = (owner.split("|") + ["?"] * 4)[:4]
    if host == socket.gethostname():
        if boot != _boot_id():
            return f"its host {host} has restarted since"
        if not pid.isdigit():
            return None
        live = _start_ticks(int(pid))
        if live is None or (start != "?" and live not in ("?", start)):
            return f"its process ({describe(owner)}) has ended"
        return None
    now_s = time.time() if now_s is None else now_s
    try:
        last = float(heartbeat_ms) / 1000 if heartbeat_ms else None
    except ValueError:
        last = None
    if last is not None and now_s - last > STALE_HEARTBEATS * heartbeat_s():
        return f"no heartbeat from {describe(owner)} for {now_s - last:.0f} s"
    return None
