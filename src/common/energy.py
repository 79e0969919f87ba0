"""Energy where the host can say it: the CPU packages' RAPL counters (Linux's powercap, /sys/class/powercap) and,
for a job on an NVIDIA GPU, the GPU's own energy counter (NVML's total energy, through nvidia-ml-py), read around a
job's timed examples. Where there are none (a VM, most cloud hosts, a non-x86 CPU) or they are not readable (since
2020 Linux lets only root read RAPL), nothing is estimated: the job says why in its `energy` tag.

What RAPL counts is the whole package (every process's work on it, and its idle power), and NVML's the whole
board, so a joules-per-token figure is the machine's energy while the job timed its tokens, over those tokens: a
fair figure on a quiet host, an upper bound on a busy one (the job's `host_busy` tag says which). A GPU job's
energy_j is the two summed where both are read (the host's CPU feeds the GPU); its tag names each part.
"""

from __future__ import annotations

from pathlib import Path

try:  # nvidia-ml-py: NVIDIA's own binding, a pure-Python wheel; it answers only where a driver is loaded
    import pynvml
except ImportError:  # a dependency (pyproject.toml); an install without it says so in the tag, CPUs unaffected
    pynvml = None

POWERCAP = Path("/sys/class/powercap")


def _packages(root: Path) -> list[Path]:
    """The package domains (intel-rapl:0, intel-rapl:1, ...; AMD's are listed under the same name): their
    subdomains (core, uncore, dram: intel-rapl:0:0) are inside the package's count, so they are left out."""
    return sorted(p for p in root.glob("intel-rapl:*") if p.name.count(":") == 1 and (p / "energy_uj").exists())


class Gpu:
    """An NVIDIA GPU's total energy counter (millijoules since its driver loaded; Volta and later), by the GPU's
    UUID (torch's device properties give it: the same board whatever CUDA_VISIBLE_DEVICES renumbers)."""

    def __init__(self, uuid: str):
        self.uuid = uuid if uuid.startswith("GPU-") else f"GPU-{uuid}"
        self.handle = None
        self.start = 0
        self.why = ""

    def begin(self) -> bool:
        if pynvml is None:
            self.why = "no GPU energy: nvidia-ml-py is not installed"
            return False
        try:
            pynvml.nvmlInit()
            self.handle = pynvml.nvmlDeviceGetHandleByUUID(self.uuid)
            self.start = pynvml.nvmlDeviceGetTotalEnergyConsumption(self.handle)
        except pynvml.NVMLError as err:  # no driver, an older GPU without the counter, a UUID NVML does not know
            self.why = f"no GPU energy: NVML could not read {self.uuid} ({err})"
            self.handle = None
            return False
        return True

    def end(self) -> float | None:
        """Joules since begin(), or None (why says why)."""
        try:
            spent = pynvml.nvmlDeviceGetTotalEnergyConsumption(self.handle) - self.start
        except pynvml.NVMLError as err:
            self.why = f"no GPU energy: NVML stopped answering ({err})"
            return None
        self.why = f"NVML, {self.uuid}: the board's energy while the job timed"
        return spent / 1e3


class Energy:
    """`with Energy() as e:` around what is timed; then `e.joules` (None where unavailable) and `e.why`. `gpu`: the
    UUID of the NVIDIA GPU the job runs on, whose energy is read too."""

    def __init__(self, root: Path = POWERCAP, gpu: str | None = None):
        self.root = root
        self.joules: float | None = None
        self.why = ""
        self._start: list[int] = []
        self._domains: list[Path] = []
        self._gpu = Gpu(gpu) if gpu else None
        self._gpu_on = False

    def _read(self) -> list[int]:
        return [int((d / "energy_uj").read_text()) for d in self._domains]

    def __enter__(self) -> Energy:
        self._gpu_on = self._gpu is not None and self._gpu.begin()
        self._rapl()
        return self

    def _rapl(self) -> None:
        self._domains = _packages(self.root) if self.root.is_dir() else []
        if not self._domains:
            self.why = f"unavailable: no RAPL counters on this host ({self.root} has no package domain)"
            return
        try:
            self._start = self._read()
        except (OSError, ValueError) as err:
            self.why = (
                f"unavailable: the RAPL counters cannot be read here ({type(err).__name__}; root only since 2020)"
            )
            self._domains = []

    def __exit__(self, *exc) -> None:
        cpu = self._rapl_joules()
        gpu = self._gpu.end() if self._gpu_on else None
        parts = [j for j in (cpu, gpu) if j is not None]
        self.joules = sum(parts) if parts else None
        if self._gpu is not None:  # a GPU job: each part said, read or not; "unavailable" only where neither was
            cpu_why = self.why.replace("unavailable: ", "no CPU energy: ", 1)
            self.why = f"{'' if parts else 'unavailable: '}{cpu_why}; {self._gpu.why}"

    def _rapl_joules(self) -> float | None:
        if not self._domains:
            return None
        try:
            end = self._read()
            ranges = [int((d / "max_energy_range_uj").read_text()) for d in self._domains]
        except (OSError, ValueError) as err:
            self.why = f"unavailable: the RAPL counters stopped answering ({type(err).__name__})"
            return None
        # a counter wraps at its range: one wrap at most between two readings seconds apart
        spent = sum((e - s) % r if r else e - s for s, e, r in zip(self._start, end, ranges))
        self.why = f"RAPL, {len(self._domains)} package(s): the whole package's energy while the job timed"
        return spent / 1e6

    def figures(self, tokens: int) -> dict[str, float]:
        """energy_j and energy_j_per_token, where measured."""
        if self.joules is None or tokens < 1:
            return {}
        return {"energy_j": self.joules, "energy_j_per_token": self.joules / tokens}
