"""Where a hardware profile executes, said out loud."""

from src.assembly.config import HardwareConfig
from src.assembly.hardware import host_threads, resolve


def profile(device: str, threads=None) -> HardwareConfig:
    return HardwareConfig("x", "x", device, dtypes=("float32",), threads=threads, resource="hw-x")


def test_cpu_runs_on_the_cpu_with_every_core_unless_told():
    assert resolve(profile("cpu")).threads == host_threads()
    placed = resolve(profile("cpu", threads=1))
    assert (placed.device, placed.threads, placed.note) == ("cpu", 1, None)


def test_an_accelerator_that_is_not_here_falls_back_with_a_note(monkeypatch):
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    cuda = resolve(profile("cuda"))
    assert cuda.executed_on == "cpu" and "no CUDA device here" in cuda.note
    npu = resolve(profile("npu"))
    assert npu.executed_on == "cpu" and "running on the host CPU" in npu.note
