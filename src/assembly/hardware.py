"""Where a hardware profile actually executes, said out loud.

A profile names the device its quantized kernels were built for. quantspec has no NPU backend, and a
CUDA profile may land on a machine without a GPU; in both cases the job runs on the host CPU and the
placement carries a note that goes to the console and to the run's tags, never silently.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from pathlib import Path

import torch

from src.assembly.config import HardwareConfig

log = logging.getLogger("quantspec")


@dataclass(frozen=True)
class Placement:
    device: str  # the torch device the job runs on
    threads: int
    note: str | None = None  # set when the profile's accelerator is not what executes

    @property
    def executed_on(self) -> str:
        return self.device


def host_threads() -> int:
    # Affinity, not cpu_count: containers often pin fewer cores than the machine has.
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


def npu_present() -> bool:
    # The amdxdna driver exposes Ryzen AI NPUs as /dev/accel/accel*.
    return any(Path("/dev/accel").glob("accel*"))


def resolve(hw: HardwareConfig) -> Placement:
    cores = host_threads()
    threads = hw.threads or cores
    if threads > cores:  # allowed (a deliberate oversubscription test), never silent
        log.warning(
            "hardware.threads=%d is more than the %d cores this process may use: threads will take turns "
            "on cores and every timing suffers; null uses each core once",
            threads,
            cores,
        )
    if hw.device == "cpu":
        return Placement("cpu", threads)
    if hw.device == "cuda":
        if torch.cuda.is_available():
            return Placement("cuda", threads)
        return Placement("cpu", threads, f"{hw.name}: no CUDA device here; running on the host CPU")
    found = "an NPU is present but quantspec has no NPU backend" if npu_present() else "no NPU found"
    return Placement("cpu", threads, f"{hw.name}: {found}; running on the host CPU")
