"""Which kernel variant a job gets (src/kernels.candidates) and how avx_vnni is built: no variant is loaded,
so these run once, not once per variant as tests/kernels/test_kernels.py does."""

import platform
import subprocess

import pytest

from src import kernels
from src.kernels import variants


def test_forcing_a_variant_this_cpu_lacks_is_one_line():
    avx2_only = {"avx2", "fma", "f16c", "sse4_2"}
    with pytest.raises(
        kernels.IsaUnavailable,
        match=r"^engine.isa=avx512: this CPU lacks avx512f.*choose engine.isa=auto "
        r"or one of: avx2, reference$",
    ):
        kernels.candidates("avx512", avx2_only, "x86_64")
    assert [v.name for v in kernels.candidates("auto", avx2_only, "x86_64")] == ["avx2", "reference"]
    assert [v.name for v in kernels.candidates("auto", {"asimd", "asimddp"}, "aarch64")] == [
        "neon_dotprod",
        "neon",
        "reference",
    ]
    with pytest.raises(kernels.IsaUnavailable, match="no kernel variant"):
        kernels.candidates("sse9", avx2_only, "x86_64")
    alder_lake = avx2_only | {"avx_vnni"}
    assert [v.name for v in kernels.candidates("auto", alder_lake, "x86_64")] == ["avx_vnni", "avx2", "reference"]
    with pytest.raises(kernels.IsaUnavailable, match="no kernel variant"):  # the tests' twin is no choice
        kernels.candidates("avx_vnni_evex", alder_lake | {"avx512_vnni", "avx512vl"}, "x86_64")


def test_a_variants_missing_kernels_come_from_the_best_variant_below_it_that_the_cpu_runs():
    # core/api.h: a grouped format a variant has no kernel of its own for is filled from these, in order
    def below(name, features, arch="x86_64"):
        variant = variants.AVX_VNNI_TWIN if name == "twin" else variants.by_name(name)
        return [v.name for v in variants.fallbacks(variant, features, arch)]

    avx2_only = {"avx2", "fma", "f16c"}
    zen4 = avx2_only | {"avx512f", "avx512bw", "avx512vl", "avx512dq", "avx512_bf16", "avx512_vnni"}
    sapphire_rapids = zen4 | {"avx_vnni"}
    assert below("avx512", zen4) == ["avx2", "reference"]
    assert below("avx512", sapphire_rapids) == ["avx_vnni", "avx2", "reference"]
    assert below("avx_vnni", sapphire_rapids) == ["avx2", "reference"]
    assert below("twin", zen4) == ["avx2", "reference"]
    assert below("avx2", avx2_only) == below("reference", avx2_only) == ["reference"]
    assert below("neon_dotprod", {"asimd", "asimddp"}, "aarch64") == ["neon", "reference"]


def test_a_variant_below_that_the_compiler_cannot_build_is_passed_over(monkeypatch, tmp_path):
    # an old compiler without -mavxvnni must not cost an AVX-512 host its own variant: avx2 and the reference fill in
    from src.kernels import loader

    def built(variant, directory):
        if variant.name == "avx_vnni":
            raise RuntimeError("g++ could not compile the avx_vnni kernels: unrecognized option -mavxvnni")
        return directory / variant.name

    monkeypatch.setattr(loader, "built_variant", built)
    monkeypatch.setattr(variants.platform, "machine", lambda: "x86_64")
    sapphire_rapids = {"avx2", "fma", "f16c", "avx_vnni", *variants.by_name("avx512").features}
    below = loader._built_below(variants.by_name("avx512"), sapphire_rapids, tmp_path)
    assert below == [tmp_path / "avx2", tmp_path / "reference"]


@pytest.mark.skipif(platform.machine() != "x86_64", reason="an x86-64 variant")
def test_avx_vnni_is_built_with_the_vex_dot_products(tmp_path):
    """avx_vnni must use AVX-VNNI's VEX instructions (a CPU with AVX-VNNI but no AVX-512 faults on the EVEX
    ones); its arithmetic is tested through the EVEX twin wherever the CPU lacks avx_vnni."""
    library = tmp_path / "qs_avx_vnni.so"
    variants.compile_variant(variants.by_name("avx_vnni"), library, variants.compiler())
    code = subprocess.run(["objdump", "-d", str(library)], capture_output=True, text=True, check=True).stdout
    assert "{vex} vpdpbusd" in code and "{vex} vpdpwssd" in code
    assert "zmm" not in code and "%ymm16" not in code and "{%k" not in code  # nothing of AVX-512


def test_a_variant_the_cpu_lacks_is_passed_over_never_loaded(tmp_path):
    """load_variants (what tests and scripts load a named variant through) never loads a variant whose
    instructions the CPU lacks: its first call would be SIGILL. It says why and takes the next one."""
    import os
    from pathlib import Path

    cache = Path(os.environ.get("QUANTSPEC_CACHE", "~/.cache/quantspec")) / "kernels"
    future = variants.Variant("future", platform.machine(), "reference.cpp", (), ("no_such_flag",))
    assert kernels.load_variants(cache, [future, variants.by_name("reference")])
    assert kernels.variant() == "reference" and kernels.reason() == "future: this CPU lacks no_such_flag"
    assert not list(Path(cache).expanduser().glob("future-*"))  # not even built


def test_the_weights_prefetch_into_l2_on_x86_and_l1_elsewhere_unless_forced(monkeypatch):
    monkeypatch.delenv("QUANTSPEC_PREFETCH", raising=False)
    intel = "vendor_id\t: GenuineIntel\nflags\t\t: avx2\n"
    amd = "vendor_id\t: AuthenticAMD\nflags\t\t: avx2\n"
    arm = "processor\t: 0\nCPU implementer\t: 0x41\nFeatures\t: fp asimd\n"
    assert variants.prefetch_flags(intel) == variants.prefetch_flags(amd) == ["-DQS_PREFETCH_LOCALITY=1"]
    assert variants.prefetch_flags(arm) == []
    monkeypatch.setenv("QUANTSPEC_PREFETCH", "l1")
    assert variants.prefetch_flags(intel) == variants.prefetch_flags(amd) == []
    monkeypatch.setenv("QUANTSPEC_PREFETCH", "l2")
    assert variants.prefetch_flags(arm) == ["-DQS_PREFETCH_LOCALITY=1"]
    # the flag is part of what keys a variant's build folder: a forced level never reuses the other's library
    assert variants.build_flags(variants.by_name("reference"))[-1] == "-DQS_PREFETCH_LOCALITY=1"
