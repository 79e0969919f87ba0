"""A local checkpoint read as the job needs it (src/models/checkpoint.py): a quantized job of a folder of sharded
safetensors reads its decoder layers one at a time as the quantization reaches them and writes the entry the whole
load writes, bit for bit; a job whose quantized weights are cached reads none of the linears they replace."""

import pytest
import torch

from src.models import checkpoint
from src.models.load import load_model
from src.models.tiny import tiny_model
from src.quant.apply import prepare, unmade
from tests.support.quant import calib

CORPUS = "def fibonacci(n):\n    a, b = 0, 1\n    for _ in range(n):\n        a, b = b, a + b\n    return a\n" * 40


def folder_of(tmp_path, arch="llama"):
    model, tok = tiny_model(arch)
    folder = tmp_path / f"tiny-{arch}"
    model.save_pretrained(folder, max_shard_size="100KB")  # sharded, with its index
    tok.save_pretrained(folder)
    return folder


def job(folder, cache):
    from src.assembly.composed import job_config

    args = ["model=hub", f"model.local_path={folder}", "precision=w4a16", "precision.awq_grid=4",
            "precision.awq_search_tokens=128", "precision.calib_samples=4", "precision.calib_seq_len=64",
            f"cache_dir={cache}"]  # fmt: skip
    return job_config(args)


def entry_files(cache):
    (entry,) = [p for p in (cache / "quantized").iterdir() if not p.name.startswith(".")]
    return {p.name: p.read_bytes() for p in sorted(entry.glob("*.safetensors"))}


@pytest.mark.parametrize("arch", ["llama", "gemma3"])
def test_a_local_checkpoint_quantized_layer_by_layer_gives_the_whole_loads_entry_and_a_cached_one_reads_no_linear(
    tmp_path, monkeypatch, arch
):
    folder = folder_of(tmp_path, arch)
    assert (folder / checkpoint.INDEX).is_file()
    read: list[list[str]] = []
    original = checkpoint.reader

    def watched(model, files, dtype):
        assert dtype == torch.bfloat16  # the layers made in the dtype w4a16 runs, as the job loads them
        make = original(model, files, dtype)
        return lambda names: (read.append(list(names)), make(names))[1]

    monkeypatch.setattr(checkpoint, "reader", watched)
    outputs = []
    for hollow, cache in ((False, tmp_path / "whole"), (True, tmp_path / "streamed"), (True, tmp_path / "streamed")):
        cfg = job(folder, cache)
        corpus = lambda: CORPUS  # noqa: E731
        loaded = load_model(  # in the precision's dtype, as src.assembly.job loads a streamed build
            cfg.model,
            cache,
            hollow=unmade(cfg.model, cfg.precision, corpus, cache) if hollow else None,
            dtype=torch.bfloat16,
        )
        model, report = prepare(loaded, cfg.model, cfg.precision, corpus, cache)
        with torch.inference_mode():
            outputs.append(model(calib(loaded.tokenizer, 1)[0:1]).logits.float())
        if hollow:
            assert loaded.make is not None
    streamed, cached = read[0 : len(read) - 1], read[-1]
    first, *layers = streamed
    assert not [n for n in first if ".layers." in n], "the hollow build read no decoder layer"
    assert len(layers) == 2 + (arch != "gemma3")  # each tiny layer, then the head (Gemma 3's is the embedding)
    assert not [n for n in cached if n.endswith("proj.weight")], "a cached job read no linear it replaces"
    assert entry_files(tmp_path / "whole") == entry_files(tmp_path / "streamed")
    assert torch.equal(outputs[0], outputs[1]) and torch.equal(outputs[1], outputs[2])


def test_a_parameter_read_from_a_checkpoint_is_its_own_copy_not_a_view_of_the_files_mapping(tmp_path):
    folder = folder_of(tmp_path)
    # in the files' own dtype (float32, as tiny_model saves them): no cast that would copy anyway
    model, make = checkpoint.hollow_model(folder, lambda m: {n for n, _ in m.named_parameters()}, torch.float32)
    names = [n for n, _ in model.named_parameters()]
    make(names)
    # the ranges of memory the folder's files are mapped at (Linux's /proc/self/maps): a view held there keeps its
    # whole file mapped, every page read of it counted in the job's memory
    mapped = []
    for line in open("/proc/self/maps").read().splitlines():
        span, *rest = line.split()
        if rest and rest[-1].startswith(str(folder)):
            lo, hi = (int(a, 16) for a in span.split("-"))
            mapped.append((lo, hi))
    for name in names:
        ptr = model.get_parameter(name).data_ptr()
        assert not any(lo <= ptr < hi for lo, hi in mapped), f"{name} is a view of its file's mapping"


def test_a_checkpoint_that_lacks_a_tensor_is_one_line_naming_it(tmp_path):
    import json

    folder = folder_of(tmp_path)
    index = json.loads((folder / checkpoint.INDEX).read_text())
    del index["weight_map"]["model.layers.1.mlp.up_proj.weight"]
    (folder / checkpoint.INDEX).write_text(json.dumps(index))
    cfg = job(folder, tmp_path / "cache")
    corpus = lambda: CORPUS  # noqa: E731
    loaded = load_model(
        cfg.model, tmp_path / "cache", hollow=unmade(cfg.model, cfg.precision, corpus, tmp_path / "cache")
    )
    with pytest.raises(checkpoint.MissingTensor, match="model.layers.1.mlp.up_proj.weight is in none of its"):
        prepare(loaded, cfg.model, cfg.precision, corpus, tmp_path / "cache")


def test_a_quantized_job_of_a_7b_checkpoint_is_estimated_as_it_streams_and_a_float_one_whole(tmp_path):
    """The memory check before anything is read: quantized, a local checkpoint is made a layer at a time, so its
    estimate is its quantized weights' and one float layer's, not the float32 model's 27 GB; at fp32 it is whole."""
    import json

    from src.assembly import memory
    from src.assembly.composed import job_config
    from src.models.random_weights import SHAPES

    folder = tmp_path / "seven"
    folder.mkdir()
    shape = {k: v for k, v in json.loads((SHAPES / "llama-2-7b.json").read_text()).items() if not k.startswith("_")}
    (folder / "config.json").write_text(json.dumps(shape))
    quantized = job_config(["model=hub", f"model.local_path={folder}", "precision=w4a16"])
    whole = job_config(["model=hub", f"model.local_path={folder}", "precision=fp32"])
    assert memory.streams(quantized) and not memory.streams(whole)
    assert 4 * memory.GB < memory.estimate_bytes(quantized) < 10 * memory.GB
    assert memory.estimate_bytes(whole) > 25 * memory.GB


def test_a_folder_loaded_whole_in_bf16_is_its_float32_load_cast(tmp_path):
    """A bf16 reference reads the checkpoint in bf16 (a 7B's 13 GB, not a 27 GB float32 load cast after): the same
    values as the float32 load cast."""
    cfg = job(folder_of(tmp_path), tmp_path / "cache")
    wide = load_model(cfg.model, tmp_path / "cache").model
    narrow = load_model(cfg.model, tmp_path / "cache", dtype=torch.bfloat16).model
    assert {p.dtype for p in narrow.parameters()} == {torch.bfloat16}
    for (name, a), (_, b) in zip(wide.named_parameters(), narrow.named_parameters(), strict=True):
        assert torch.equal(a.to(torch.bfloat16), b), name
