"""A job's peak resident memory, its child processes' included: another runtime (OpenVINO, ONNX Runtime GenAI,
llama.cpp) runs in a child (src.engine.runtimes.isolated) that holds the model, and a code task's completions
run in sandboxed children; the job's own process alone says nothing true of those.

Each process's own peak is exact: the kernel keeps it (VmHWM in /proc/<pid>/status), and this process's is reset
at each job's start (clear_refs 5), so a sweep's jobs in one process report their own. The children's is read by a
thread every PERIOD_S while the job runs: at each reading, the sum of the live children's own peaks. Its maximum
is the children's figure: exact for one child (its peak is its own, read before it ends, and at the job's end),
and never the sum of children that were not alive together (a code task's completions run a few at a time). A
child that lives and ends between two readings is missed: a sandboxed completion's ~30 MB, not a runtime. The
job's figure, `peak_rss_gb`, adds the two: what the job needed at most, its children's peak and its own at once.
"""

from __future__ import annotations

import resource
import threading
from pathlib import Path

import psutil

GB = 2**30
PERIOD_S = 0.2


def reset_own() -> None:
    """Start this process's peak afresh (Linux: clear_refs 5), so each job of a sweep run in one process reports
    its own peak, not the largest job's before it."""
    try:
        Path("/proc/self/clear_refs").write_text("5")
    except OSError:
        pass  # not Linux, or not allowed: the peak then counts from the process's start


def own_gb() -> float:
    """This process's peak resident memory since the last reset, in GB (2**30 bytes)."""
    found = _hwm_kb("self")
    if found is not None:
        return found * 1024 / GB
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 / GB


def _hwm_kb(pid: int | str) -> int | None:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1])
    except (OSError, ValueError):
        pass  # ended, or another user's (a sandbox): it counts as not there
    return None


def children_kb() -> int:
    """The live children's own peaks, summed (kB): every descendant of this process."""
    try:
        children = psutil.Process().children(recursive=True)
    except psutil.Error:
        return 0
    return sum(_hwm_kb(child.pid) or 0 for child in children)


class Peak:
    """`with Peak() as peak:` around a job: its process's peak reset at the start, its children's read in the
    background; afterwards `peak.figures()`."""

    def __init__(self, period_s: float = PERIOD_S):
        self.period_s = period_s
        self.children_peak_kb = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="quantspec-peak-memory", daemon=True)

    def _loop(self) -> None:
        while not self._stop.wait(self.period_s):
            self.read()

    def read(self) -> None:
        self.children_peak_kb = max(self.children_peak_kb, children_kb())

    def __enter__(self) -> Peak:
        reset_own()
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
        self.read()  # a child still alive at the end (a runtime ends with its job, after this)

    def figures(self) -> dict[str, float]:
        """peak_rss_gb (the job's, children included), peak_rss_own_gb, peak_rss_children_gb."""
        own, children = own_gb(), self.children_peak_kb * 1024 / GB
        return {"peak_rss_gb": own + children, "peak_rss_own_gb": own, "peak_rss_children_gb": children}
