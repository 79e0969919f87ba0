"""w8a8's many-row path: every candidate gives the int8 product, and each host's choice is measured once (AMX's
own path, where this process has it, is checked in tests/kernels/test_amx.py)."""

import json

import torch

from src.kernels.modules import FLOAT_GEMMS
from src.quant import prefill
from src.quant.formats import build
from src.quant.linear import install_prefill, int8_tensors


def test_both_paths_give_the_exact_int8_product():
    g = torch.Generator().manual_seed(0)
    x = torch.randint(-127, 128, (33, 640), dtype=torch.int8, generator=g)
    w = torch.randint(-127, 128, (48, 640), dtype=torch.int8, generator=g)
    exact = (x.long() @ w.long().t()).float()  # |sums| < 2^24 here: exact in fp32 too
    for path in prefill.PATHS:
        assert torch.equal(prefill.int8_gemm(x, w, path), exact), path


def test_the_choice_is_measured_once_per_host_and_installed(tmp_path):
    path, seconds = prefill.choose(tmp_path, "cpu", 2)
    assert path in prefill.paths() and set(seconds) == set(prefill.paths()) and path == min(seconds, key=seconds.get)
    cached = json.loads((tmp_path / prefill.CACHE).read_text())
    assert len(cached) == 1
    (tmp_path / prefill.CACHE).write_text(
        json.dumps({k: {p: 1.0 if p == "float" else 2.0 for p in prefill.paths()} for k in cached})
    )
    assert prefill.choose(tmp_path, "cpu", 2)[0] == "float"  # the cached measurement, not a new one
    # a record that reads as JSON but is not one (null, a list, an entry without a path's time, a nan or a
    # string for one): measured again and rewritten, never a TypeError
    key = next(iter(cached))
    for damaged in ("null", "[1]", json.dumps({key: {"int_mm": 1.0}}), json.dumps({key: {"int_mm": "x", "float": 1}})):
        (tmp_path / prefill.CACHE).write_text(damaged)
        assert prefill.choose(tmp_path, "cpu", 2)[0] in prefill.paths(), damaged
        assert set(json.loads((tmp_path / prefill.CACHE).read_text())[key]) == set(prefill.paths())
    model = torch.nn.Sequential(build("w8a8", int8_tensors(torch.randn(16, 64), None), None, torch.float32))
    assert install_prefill(model, "float") == 1 and model[0].prefill == "float"
    x = torch.randn(40, 64)  # more rows than a step: the chosen path
    model[0].prefill = "int_mm"
    ref = model(x)
    model[0].prefill = "float"
    torch.testing.assert_close(model(x), ref, rtol=0, atol=0)


def test_the_bf16_gemms_path_is_measured_once_per_host_and_installed(tmp_path):
    path, seconds = prefill.choose_float(tmp_path, "cpu", 2)
    assert path in FLOAT_GEMMS and set(seconds) == set(FLOAT_GEMMS) and path == min(seconds, key=seconds.get)
    cached = json.loads((tmp_path / prefill.FLOAT_CACHE).read_text())
    (tmp_path / prefill.FLOAT_CACHE).write_text(json.dumps({k: {"bf16": 2.0, "fp32": 1.0} for k in cached}))
    assert prefill.choose_float(tmp_path, "cpu", 2)[0] == "fp32"  # the cached measurement, not a new one
    assert not (tmp_path / prefill.CACHE).exists()  # w8a8's choice is a record of its own
    w = torch.randn(16, 64)
    bf16 = build("w8a16", int8_tensors(w, None), None, torch.bfloat16)
    fp32 = build("w8a16", int8_tensors(w, None), None, torch.float32)  # its GEMM is fp32 already: not a bf16 one
    model = torch.nn.Sequential(bf16, fp32, build("w8a8", int8_tensors(w, None), None, torch.float32))
    assert prefill.bf16_gemm_linears(model) == [bf16]
    assert prefill.install_float_gemm(model, "fp32") == 1 and bf16.float_gemm == "fp32" and fp32.float_gemm == "bf16"
