"""AMX's int8 GEMM for w8a8's many rows (src/kernels/core/amx.cpp): bit for bit the ATen path's result, taken by
the w8a8 modules where the host's probe chooses it, and a refusal by Linux said in one line. Runs on hosts whose
CPU has AMX's int8 tiles; elsewhere the one-line reason a job records is checked instead."""

import subprocess
import sys

import pytest
import torch

from src import kernels
from src.common.environment import PROJECT_ROOT
from src.kernels import amx
from src.quant import prefill, qparams
from src.quant.formats import build
from src.quant.linear import int8_tensors
from tests.support.kernels import KERNELS as CACHE


@pytest.fixture
def tiles():
    lacks = amx.missing()
    if lacks:
        pytest.skip(f"this CPU lacks {', '.join(lacks)}: AMX's int8 tiles cannot run here")
    assert kernels.load(CACHE), kernels.reason()
    reason = amx.enable(CACHE)
    if reason is not None:
        pytest.fail(f"AMX could not be enabled on a CPU that has it: {reason}")
    return True


# M: one tile, a tail past whole pairs of 16; N: a tail of channels past pairs of 16 (the copied rows); K: 64 .. 2048
SHAPES = [(512, 640, 2048), (37, 128, 45), (17, 1024, 100), (16, 64, 32), (50, 2048, 33), (1, 64, 1)]


@pytest.mark.parametrize("m,k,n", SHAPES)
def test_the_amx_gemm_is_the_aten_paths_result_bit_for_bit(tiles, m, k, n):
    g = torch.Generator().manual_seed(m + n)
    x = torch.randn(m, k, generator=g) * torch.logspace(-2, 2, k)  # per-token scales far apart
    w_q, w_scale = qparams.int8_per_channel(torch.randn(n, k, generator=g))
    ref = prefill.gemm(x, w_q, w_scale, "int_mm")
    assert torch.equal(torch.ops.quantspec.int8_gemm_amx(x, w_q, w_scale), ref)
    assert torch.equal(
        prefill.gemm(x.bfloat16(), w_q, w_scale, "amx"), prefill.gemm(x.bfloat16(), w_q, w_scale, "int_mm")
    )


def test_the_amx_sums_at_their_worst_case(tiles):
    # |q| = 127 everywhere over K = 2048: the largest int32 sums, exact
    x = torch.full((20, 2048), 5.0)
    x[7] = -5.0
    w_q, w_scale = torch.full((40, 2048), 127, dtype=torch.int8), torch.full((40,), 0.5)
    y = torch.ops.quantspec.int8_gemm_amx(x, w_q, w_scale)
    assert torch.equal(y, prefill.gemm(x, w_q, w_scale, "int_mm")) and y[7, 0] == -(127 * 127 * 2048) * (5 / 127) * 0.5


def test_a_w8a8_module_on_amx_gives_its_aten_result_and_a_k_amx_cannot_step_takes_int_mm(tiles):
    assert "amx" in prefill.paths()
    for k in (640, 96):  # 96: no multiple of 64
        module = build("w8a8", int8_tensors(torch.randn(48, k), None), None, torch.float32, gemv=True)
        x = torch.randn(1, 40, k)  # more rows than a step: the many-row path
        module.prefill = "int_mm"
        ref = module(x)
        module.prefill = "amx"
        assert torch.equal(module(x), ref), k


def test_a_refusal_is_one_line_and_leaves_aten_in_charge():
    # A process asks Linux for another state component than the tile data's: a real refusal (EOPNOTSUPP) from
    # arch_prctl, said in one line, and the process has no AMX path. Without AMX the CPU's lack is the line.
    code = (
        "from src import kernels; from src.kernels import amx; from src.quant import prefill;"
        f"kernels.load({str(CACHE)!r}); print(amx.enable({str(CACHE)!r}, feature=17)); print(prefill.paths())"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=PROJECT_ROOT, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    reason, paths = out.stdout.strip().splitlines()[-2:]
    if amx.missing():
        assert reason.startswith("this CPU lacks ") and "amx_int8" in reason
    else:
        assert reason == "Linux refused the AMX tile state (arch_prctl: Operation not supported)"
    assert paths == "('int_mm', 'float')"
