"""What the host did while a job ran: MLflow system metrics (CPU, memory) sampled in the background,
and the CPU that other processes took while the job was timed (its peak memory: src.common.peakmemory).

The machine quantspec is measured on is often shared: another process moves a time/token by tens of
percent. A job timed while others used the CPU is flagged (src.tracking.sweep.record tags it host_busy), never hidden.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

import psutil

MB = 1024 * 1024


def _host_busy_s() -> float:
    """CPU seconds the whole host has been busy (steal included: time a hypervisor gave to others)."""
    t = psutil.cpu_times()
    return t.user + t.nice + t.system + getattr(t, "irq", 0) + getattr(t, "softirq", 0) + getattr(t, "steal", 0)


def _own_s(process: psutil.Process) -> float:
    """CPU seconds of this process and its children: the ended ones (counted once waited for) and the live
    ones (another runtime's engine runs in a child of the job: src.engine.runtimes.isolated), which are the job's own
    work, not a neighbour's."""
    t = process.cpu_times()
    total = t.user + t.system + t.children_user + t.children_system
    for child in process.children(recursive=True):
        try:
            c = child.cpu_times()
            total += c.user + c.system
        except psutil.Error:
            pass  # ended between the listing and the reading: its time is in children_* once waited for
    return total


class OthersCpu:
    """Over the sections it wraps (`with others: ...`), the CPU seconds used by every process but this
    one. Counters tick in 10 ms steps, so a section's figure is only meaningful over a second or more;
    the signed sum over all sections is kept, and clipped at zero only when read."""

    MIN_WALL_S = 1.0

    def __init__(self):
        self._process = psutil.Process()
        self.wall_s = 0.0
        self.others_s = 0.0

    def __enter__(self) -> OthersCpu:
        self._start = (time.perf_counter(), _host_busy_s(), _own_s(self._process))
        return self

    def __exit__(self, *exc) -> None:
        t0, host0, own0 = self._start
        self.wall_s += time.perf_counter() - t0
        self.others_s += (_host_busy_s() - host0) - (_own_s(self._process) - own0)

    def cores(self) -> float | None:
        """Other processes' average CPU use in cores while timed; None when timed too briefly to tell."""
        return max(0.0, self.others_s / self.wall_s) if self.wall_s >= self.MIN_WALL_S else None


class Sampler:
    """MLflow's system metrics, sampled every `interval_s` on a daemon thread and handed to `log`
    (names under `system/`, which the MLflow UI charts in its System metrics section), plus the process's
    resident memory and other processes' CPU over each interval (`system/others_cpu_cores_per_interval`, a
    series over the whole job, loading included; the job's busy figure is `others_cpu_cores`, taken while
    it was timed, which its host_busy tags repeat)."""

    def __init__(self, log: Callable[[dict[str, float], int], None], interval_s: float):
        self.log, self.interval_s = log, interval_s
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def sample(self, others: OthersCpu | None) -> dict[str, float]:
        memory = psutil.virtual_memory()
        values = {
            "system/cpu_utilization_percentage": psutil.cpu_percent(),
            "system/system_memory_usage_megabytes": (memory.total - memory.available) / MB,
            "system/system_memory_usage_percentage": memory.percent,
            "system/process_rss_megabytes": psutil.Process().memory_info().rss / MB,
        }
        if others is not None:
            others.__exit__()
            if others.wall_s > 0:
                values["system/others_cpu_cores_per_interval"] = max(0.0, others.others_s / others.wall_s)
        return values

    def _loop(self) -> None:
        step = 0
        while True:
            others = OthersCpu().__enter__()
            stopping = self._stop.wait(self.interval_s)
            step += 1
            try:  # a last sample when stopping: a job shorter than the interval still has one
                self.log(self.sample(others), step)
            except Exception:  # noqa: BLE001 - the job's own records say what failed; sampling just stops
                return
            if stopping:
                return

    def __enter__(self) -> Sampler:
        if self.interval_s > 0:
            psutil.cpu_percent()  # the first call only starts psutil's interval
            self._thread = threading.Thread(target=self._loop, name="quantspec-system-metrics", daemon=True)
            self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
