"""The kernel variants: which ISA each targets, the flags it is compiled with, the CPU features it needs,
and how one is built (a plain shared library from core/, no torch: core/api.h says why).

Best first per architecture; `reference` (portable C++) fits every CPU.
"""

from __future__ import annotations

import os
import platform
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

from src.common import envvars
from src.common.descendants import ended_on_error

CORE = Path(__file__).with_name("core")
# Every variant is compiled with these: -ffp-contract=off keeps the scalar parts (norms, the quantizers)
# the same arithmetic on every variant; hidden visibility exports qs_kernels_get alone.
COMMON_FLAGS = [
    "-O3",
    "-std=c++17",
    "-fPIC",
    "-shared",
    "-fvisibility=hidden",
    "-fvisibility-inlines-hidden",
    "-ffp-contract=off",
    "-Wno-ignored-attributes",
]


@dataclass(frozen=True)
class Variant:
    name: str
    arch: str  # platform.machine() of the CPUs it runs on
    source: str  # under core/
    flags: tuple[str, ...]  # ISA flags
    features: tuple[str, ...]  # /proc/cpuinfo flags (x86) or Features (Arm) it needs


VARIANTS = (
    Variant(
        "avx512",
        "x86_64",
        "avx512.cpp",
        ("-mavx512f", "-mavx512bw", "-mavx512vl", "-mavx512dq", "-mavx512bf16", "-mavx512vnni", "-mfma"),
        ("avx512f", "avx512bw", "avx512vl", "avx512dq", "avx512_bf16", "avx512_vnni"),
    ),
    Variant(
        "avx_vnni",
        "x86_64",
        "avx2.cpp",
        ("-mavx2", "-mfma", "-mf16c", "-mavxvnni"),
        ("avx2", "fma", "f16c", "avx_vnni"),
    ),
    Variant("avx2", "x86_64", "avx2.cpp", ("-mavx2", "-mfma", "-mf16c"), ("avx2", "fma", "f16c")),
    Variant("neon_dotprod", "aarch64", "neon.cpp", ("-march=armv8.2-a+dotprod",), ("asimd", "asimddp")),
    Variant("neon", "aarch64", "neon.cpp", ("-march=armv8-a",), ("asimd",)),
    Variant("reference", "", "reference.cpp", (), ()),
)
NAMES = tuple(v.name for v in VARIANTS)

# avx_vnni's code with AVX512-VNNI's EVEX encoding of its two dot-product instructions (same results):
# no emulator here runs AVX-VNNI, so the tests check this twin on AVX-512 VNNI hosts. Never chosen for a job.
AVX_VNNI_TWIN = Variant(
    "avx_vnni_evex",
    "x86_64",
    "avx2.cpp",
    ("-mavx2", "-mfma", "-mf16c", "-mavx512vnni", "-mavx512vl", "-DQS_VNNI_EVEX"),
    ("avx2", "fma", "f16c", "avx512_vnni", "avx512vl"),
)

# The AMX library (core/amx.cpp): not a gemv variant but w8a8's GEMM for many rows, built and loaded beside the
# variant in use where the CPU has the tile unit (src.kernels.amx).
AMX = Variant(
    "amx",
    "x86_64",
    "amx.cpp",
    ("-mavx512f", "-mavx512bw", "-mavx512vl", "-mavx512dq", "-mamx-tile", "-mamx-int8"),
    ("avx512f", "avx512bw", "avx512vl", "avx512dq", "amx_tile", "amx_int8"),
)

# The environment that holds torch's own kernels to an ISA (ATen's dispatch, oneDNN's and MKL's GEMMs),
# read once when torch loads: with engine.isa=avx2, an AVX-512 host then runs a job as an AVX2-only host
# would (the benchmarks use it; oneDNN's verbose log confirms "isa:Intel AVX2").
ATEN_ISA = {
    "avx2": {"ATEN_CPU_CAPABILITY": "avx2", "ONEDNN_MAX_CPU_ISA": "AVX2", "MKL_ENABLE_INSTRUCTIONS": "AVX2"},
}


def by_name(name: str) -> Variant:
    for v in (*VARIANTS, AVX_VNNI_TWIN, AMX):
        if v.name == name:
            return v
    raise KeyError(name)


def for_arch(arch: str | None = None) -> list[Variant]:
    """The variants for this architecture (or `arch`), best first; `reference` last."""
    arch = arch or platform.machine()
    return [v for v in VARIANTS if v.arch in (arch, "")]


def fallbacks(variant: Variant, features: set[str], arch: str | None = None) -> list[Variant]:
    """Where `variant`'s missing kernels come from (core/api.h: a grouped format it has none of its own for), best
    first: the variants below it for its architecture that this CPU runs, `reference` last. avx_vnni's EVEX twin
    stands where avx_vnni does."""
    ordered = for_arch(arch)
    place = next(
        (
            i
            for i, v in enumerate(ordered)
            if v.name == variant.name or (variant is AVX_VNNI_TWIN and v.name == "avx_vnni")
        ),
        len(ordered) - 1,
    )
    return [v for v in ordered[place + 1 :] if not missing(v, features, arch)] or [by_name("reference")]


def _cpuinfo() -> str:
    """/proc/cpuinfo's text, empty where there is none."""
    try:
        return Path("/proc/cpuinfo").read_text()
    except OSError:
        return ""


def cpu_features(cpuinfo: str | None = None) -> set[str]:
    """The CPU's feature flags as Linux reports them (the kernel clears those the OS does not enable)."""
    cpuinfo = _cpuinfo() if cpuinfo is None else cpuinfo
    for line in cpuinfo.splitlines():
        if line.startswith(("flags", "Features")):
            return set(line.split(":", 1)[1].split())
    return set()


def missing(variant: Variant, features: set[str], arch: str | None = None) -> list[str]:
    """What this CPU lacks to run `variant` (empty: it runs here)."""
    arch = arch or platform.machine()
    if variant.arch not in (arch, ""):
        return [f"{variant.arch} (this CPU is {arch})"]
    return [f for f in variant.features if f not in features]


def compiler() -> str | None:
    """The C++ compiler: $CXX, else c++ or g++ on PATH."""
    for name in (os.environ.get("CXX"), "c++", "g++"):
        if name and shutil.which(name):
            return name
    return None


def sources(variant: Variant) -> list[Path]:
    """What a variant's library is built from: the shared headers and its own source."""
    return sorted(CORE.glob("*.h")) + [CORE / variant.source]


def _compile(cmd: list[str], what: str) -> None:
    """Run a compile; raises with the compiler's first error line on failure."""
    with ended_on_error():  # a stop mid-compile ends the compiler driver's children (cc1plus, as) too
        done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode != 0:
        lines = [line for line in done.stderr.splitlines() if "error" in line] or done.stderr.splitlines() or ["?"]
        raise RuntimeError(f"{cmd[0]} could not compile {what}: {lines[0].strip()}")


def prefetch_flags(cpuinfo: str | None = None) -> list[str]:
    """The cache the weights' prefetches fill (core/blocking.h's QS_PREFETCH_LOCALITY, measured there): L2 on x86
    CPUs (Intel and AMD), L1 (the default) elsewhere (Arm); QUANTSPEC_PREFETCH=l1 or l2 forces one, to measure.
    On a 2-core AVX-512 EPYC, weights read from memory (bench_kernels' copies past the caches), L2's w4a16 read
    31-33 GB/s against L1's 26-27 in turns and a cached Llama-2-7B-shape decode job took 117-122 ms a token
    against 129-130 (2026-12-07); L1 had been chosen there by timings that reread one matrix from the
    last-level cache."""
    forced = envvars.prefetch()
    if forced is not None:
        return ["-DQS_PREFETCH_LOCALITY=1"] if forced == "l2" else []
    cpuinfo = _cpuinfo() if cpuinfo is None else cpuinfo
    vendors = ("GenuineIntel", "AuthenticAMD")
    x86 = any(line.startswith("vendor_id") and line.split(":")[-1].strip() in vendors for line in cpuinfo.splitlines())
    return ["-DQS_PREFETCH_LOCALITY=1"] if x86 else []


def build_flags(variant: Variant) -> list[str]:
    """Everything a variant is compiled with (its build folder is keyed by them)."""
    return [*COMMON_FLAGS, *variant.flags, *prefetch_flags()]


def compile_variant(variant: Variant, out: Path, cxx: str) -> None:
    """Compile one variant to the shared library `out`."""
    _compile([cxx, *build_flags(variant), str(CORE / variant.source), "-o", str(out)], f"the {variant.name} kernels")


def compile_selftest(out: Path, cxx: str) -> None:
    """core/selftest.cpp (a variant against the reference variant, no torch) as the program `out`."""
    _compile(
        [cxx, "-O2", "-std=c++17", "-ffp-contract=off", str(CORE / "selftest.cpp"), "-o", str(out), "-ldl"],
        "the kernel self-test",
    )
