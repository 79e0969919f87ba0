"""Every kernel variant against the reference variant through core/selftest.cpp, without torch: natively
for the variants this CPU runs (on AVX-512 VNNI hosts also avx_vnni's EVEX twin), and the Arm64 variants
(neon, neon_dotprod) cross-compiled with Debian's g++-aarch64-linux-gnu and run under qemu-aarch64 (`-cpu max` has the dot product instructions).
scripts/setup installs both where it can; without them the Arm test skips and says so."""

import platform
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from src.kernels import variants

ARM_CXX, QEMU, ARM_ROOT = "aarch64-linux-gnu-g++", "qemu-aarch64", "/usr/aarch64-linux-gnu"


def _selftest(tmp_path: Path, cxx: str, names: list[str], run: list[str]) -> dict[str, str]:
    program = tmp_path / "selftest"
    variants.compile_selftest(program, cxx)
    for name in names + ["reference"]:
        variants.compile_variant(variants.by_name(name), tmp_path / f"{name}.so", cxx)
    outputs = {}
    for name in names:
        done = subprocess.run(
            [*run, str(program), str(tmp_path / f"{name}.so"), str(tmp_path / "reference.so")],
            capture_output=True,
            text=True,
            timeout=300,
        )
        outputs[name] = done.stdout + done.stderr
        assert done.returncode == 0, outputs[name]
        assert f"variant {name} against reference" in done.stdout and " 0 failed" in done.stdout, outputs[name]
    return outputs


def _checks(text: str) -> int:
    found = re.search(r"(\d+) passed, 0 failed", text)
    return int(found.group(1)) if found else 0


def test_this_cpus_variants_pass_the_selftest(tmp_path):
    cxx = variants.compiler()
    assert cxx, "no C++ compiler: scripts/setup installs g++"
    features = variants.cpu_features()
    names = [
        v.name
        for v in (*variants.for_arch(), variants.AVX_VNNI_TWIN)
        if not variants.missing(v, features) and v.name != "reference"
    ]
    out = _selftest(tmp_path, cxx, names or ["reference"], [])
    assert all(_checks(text) >= 25 for text in out.values())  # every format each variant has, and the rest


@pytest.mark.skipif(platform.machine() != "x86_64", reason="the Arm cross-build is checked from x86-64 hosts")
def test_arm_variants_pass_the_selftest_under_qemu(tmp_path):
    lacking = [tool for tool in (ARM_CXX, QEMU) if shutil.which(tool) is None]
    if lacking:
        pytest.skip(
            f"{' and '.join(lacking)} not installed (apt-get install g++-aarch64-linux-gnu qemu-user; "
            f"scripts/setup does it as root)"
        )
    out = _selftest(tmp_path, ARM_CXX, ["neon_dotprod", "neon"], [QEMU, "-cpu", "max", "-L", ARM_ROOT])
    assert all(_checks(text) >= 25 for text in out.values())  # every format each variant has, and the rest
