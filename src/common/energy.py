"""Energy where the host can say it: the CPU packages' RAPL counters (Linux's powercap, /sys/class/powercap) read
around a job's timed examples. Where there are none (a VM, most cloud hosts, a non-x86 CPU) or they are not
readable (since 2020 Linux lets only root read them), nothing is estimated: the job says why in its `energy` tag.

What RAPL counts is the whole package (every process's work on it, and its idle power), so a joules-per-token
figure is the host's energy while the job timed its tokens, over those tokens: a fair figure on a quiet host,
an upper bound on a busy one (the job's `host_busy` tag says which). A GPU's energy (NVML) is not read yet.
"""

from __future__ import annotations

from pathlib import Path

POWERCAP = Path("/sys/class/powercap")


def _packages(root: Path) -> list[Path]:
    """The package domains (intel-rapl:0, intel-rapl:1, ...; AMD's are listed under the same name): their
    subdomains (core, uncore, dram: intel-rapl:0:0) are inside the package's count, so they are left out."""
    return sorted(p for p in root.glob("intel-rapl:*") if p.name.count(":") == 1 and (p / "energy_uj").exists())


class Energy:
    """`with Energy() as e:` around what is timed; then `e.joules` (None where unavailable) and `e.why`."""

    def __init__(self, root: Path = POWERCAP):
        self.root = root
        self.joules: float | None = None
        self.why = ""
        self._start: list[int] = []
        self._domains: list[Path] = []

    def _read(self) -> list[int]:
        return [int((d / "energy_uj").read_text()) for d in self._domains]

    def __enter__(self) -> Energy:
        self._domains = _packages(self.root) if self.root.is_dir() else []
        if not self._domains:
            self.why = f"unavailable: no RAPL counters on this host ({self.root} has no package domain)"
            return self
        try:
            self._start = self._read()
        except (OSError, ValueError) as err:
            self.why = (
                f"unavailable: the RAPL counters cannot be read here ({type(err).__name__}; root only since 2020)"
            )
            self._domains = []
        return self

    def __exit__(self, *exc) -> None:
        if not self._domains:
            return
        try:
            end = self._read()
            ranges = [int((d / "max_energy_range_uj").read_text()) for d in self._domains]
        except (OSError, ValueError) as err:
            self.why = f"unavailable: the RAPL counters stopped answering ({type(err).__name__})"
            return
        # a counter wraps at its range: one wrap at most between two readings seconds apart
        spent = sum((e - s) % r if r else e - s for s, e, r in zip(self._start, end, ranges))
        self.joules = spent / 1e6
        self.why = f"RAPL, {len(self._domains)} package(s): the whole package's energy while the job timed"

    def figures(self, tokens: int) -> dict[str, float]:
        """energy_j and energy_j_per_token, where measured."""
        if self.joules is None or tokens < 1:
            return {}
        return {"energy_j": self.joules, "energy_j_per_token": self.joules / tokens}
