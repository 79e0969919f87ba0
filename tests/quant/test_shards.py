"""A quantized cache entry written layer by layer (src/quant/shards.py): a build cut short after a layer resumes at
the next one and writes what an uninterrupted build writes, bit for bit; a partial entry whose files do not match
its record starts over, in one line; a partial entry is never read as a cache."""

import logging

import pytest
import torch

from src.common.cache import MANIFEST
from src.models.tiny import tiny_model
from src.quant import shards
from src.quant.apply import quantize_model
from tests.support.quant import quant_spec

SPEC = quant_spec("awq", "w4a16", group_size=128, awq_grid=4, awq_search_tokens=128, head_format="w5a16", gptq=("*",))
CORPUS = "def fibonacci(n):\n    a, b = 0, 1\n    for _ in range(n):\n        a, b = b, a + b\n    return a\n" * 40


class Cut(Exception):
    """Stands for a kill after a layer's files were written."""


def build(root, arch="llama"):
    model, tok = tiny_model(arch)
    _, report = quantize_model(
        model, tok, arch, SPEC, f"tiny:{arch}", lambda: CORPUS, 4, 64, root, f"tiny-{arch}", torch.bfloat16
    )
    return report


def entry_bytes(directory):
    return {p.name: p.read_bytes() for p in sorted(directory.iterdir()) if p.name != MANIFEST}


def cut_after(monkeypatch, index):
    original = shards.Partial.layer

    def layer(self, i, *args):
        original(self, i, *args)
        if i == index:
            raise Cut

    monkeypatch.setattr(shards.Partial, "layer", layer)
    return original


@pytest.mark.parametrize("arch", ["llama", "gemma3"])
def test_a_build_cut_after_a_layer_resumes_at_the_next_and_writes_what_an_uninterrupted_build_writes(
    tmp_path, monkeypatch, caplog, arch
):
    whole = build(tmp_path / "whole", arch)
    original = cut_after(monkeypatch, 0)
    with pytest.raises(Cut):
        build(tmp_path / "cut", arch)
    (partial,) = (tmp_path / "cut" / "quantized").glob(".*.partial")
    assert not list((tmp_path / "cut" / "quantized").glob(f"tiny-{arch}-*")), "no cache entry from a partial"
    assert (partial / "model" / shards.layer_file(0)).is_file() and (partial / "model" / shards.PROGRESS).is_file()
    monkeypatch.setattr(shards.Partial, "layer", original)
    resumed = []
    monkeypatch.setattr(shards.Partial, "layer", lambda self, i, *a: (resumed.append(i), original(self, i, *a)))
    with caplog.at_level(logging.WARNING, logger="quantspec"):
        again = build(tmp_path / "cut", arch)
    assert resumed == [1], "layer 0 was not rounded again"
    assert any("resuming the quantization" in r.getMessage() and "at layer 2" in r.getMessage() for r in caplog.records)
    assert again.built and not partial.exists()
    assert entry_bytes(again.cache_dir).keys() == entry_bytes(whole.cache_dir).keys()
    for name, data in entry_bytes(whole.cache_dir).items():
        if name != "quantized.json":  # its info holds the build's own time
            assert entry_bytes(again.cache_dir)[name] == data, name


def test_a_partial_entry_whose_layer_does_not_match_its_record_starts_over_in_one_line(tmp_path, monkeypatch, caplog):
    whole = build(tmp_path / "whole")
    original = cut_after(monkeypatch, 0)
    with pytest.raises(Cut):
        build(tmp_path / "cut")
    monkeypatch.setattr(shards.Partial, "layer", original)
    (partial,) = (tmp_path / "cut" / "quantized").glob(".*.partial")
    damaged = partial / "model" / shards.layer_file(0)
    data = bytearray(damaged.read_bytes())
    data[-1] ^= 0xFF
    damaged.write_bytes(bytes(data))
    with caplog.at_level(logging.WARNING, logger="quantspec"):
        again = build(tmp_path / "cut")
    said = [r.getMessage() for r in caplog.records if "starts over" in r.getMessage()]
    assert len(said) == 1 and f"{shards.layer_file(0)} does not match its recorded sha256" in said[0], said
    assert entry_bytes(again.cache_dir)[shards.layer_file(0)] == entry_bytes(whole.cache_dir)[shards.layer_file(0)]


def _mapped_file(tensor: torch.Tensor) -> str | None:
    """The file this process has mapped where the tensor's data lies, or None (anonymous memory)."""
    address = tensor.data_ptr()
    with open("/proc/self/maps") as maps:
        for line in maps:
            fields = line.split()
            low, high = (int(a, 16) for a in fields[0].split("-"))
            if low <= address < high:
                return fields[5] if len(fields) > 5 and fields[5].startswith("/") else None
    return None


def test_a_cached_entrys_grouped_weights_are_read_in_place_from_its_mapped_files_and_the_rest_copied(tmp_path):
    """Stored in the gemv kernels' lane layout, a cached model's grouped weights come as views of its mapped
    safetensors files (nothing copied or repacked at load; the page cache holds them once); their scales and
    zeros come as copies, so a module that keeps those keeps no file mapped."""
    from src.quant import cache

    report = build(tmp_path)
    weights = cache.load(report.cache_dir)
    for name in weights.layers:
        tensors = weights.layers[name]
        (field,) = [f for f in tensors if f.startswith(("lanes", "q"))]
        assert field.startswith("lanes"), f"{name}: {field} (the tiny model's widths are whole blocks of 128)"
        where = _mapped_file(tensors[field])
        assert where is not None and where.startswith(str(report.cache_dir)), (name, where)
        assert _mapped_file(tensors["scale"]) is None and _mapped_file(tensors["zero"]) is None, name
