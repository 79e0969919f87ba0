"""model.weights=random: the seeds' models at their published shapes, built fast in bf16, timed but never
scored; and the memory estimate that refuses a job that cannot fit (set against a job's measured peak in
tests/e2e/test_memory.py, as that is a process's own)."""

import time

import pytest
import torch

from src.assembly import memory
from src.assembly.config import ConfigError, job_config_from_dict
from src.models.random_weights import config_of, parameter_count, random_model, shapes
from tests.support.cli import compose_job, run_cli

SEEDS = {
    "llama-2-7b": 6.74e9,
    "CodeLlama-7b-hf": 6.74e9,
    "opt-6.7b": 6.66e9,
    "Qwen1.5-7B-Chat": 7.72e9,
    "llama-160m": 0.162e9,
    "opt-125m": 0.125e9,
    "Qwen1.5-0.5B-Chat": 0.464e9,
}


def test_every_seed_model_has_its_published_shape():
    assert set(SEEDS) <= set(shapes())
    for name, published in SEEDS.items():
        assert parameter_count(config_of(name)) == pytest.approx(published, rel=0.01), name


@pytest.mark.parametrize("name", ["llama-160m", "opt-125m"])
def test_a_random_model_is_built_in_seconds_in_bf16_and_decodes(name):
    start = time.perf_counter()
    model, tokenizer = random_model(name)
    assert time.perf_counter() - start < 20
    params = dict(model.named_parameters())
    assert all(p.dtype == torch.bfloat16 for p in params.values())
    weights = [p for n, p in params.items() if p.dim() == 2]
    assert 0.015 < weights[1].float().std().item() < 0.025
    assert not torch.equal(weights[1].flatten()[:1000], weights[2].flatten()[:1000])  # layers differ
    norms = [p for n, p in params.items() if "norm" in n and n.endswith("weight")]
    assert norms and all(bool((p == 1).all()) for p in norms)
    again, _ = random_model(name)
    assert torch.equal(next(again.parameters()), next(model.parameters()))  # the same seed, the same model
    ids = tokenizer("hello", return_tensors="pt").input_ids
    out = model.generate(ids, max_new_tokens=4, do_sample=False)
    assert out.shape[1] > ids.shape[1] and torch.isfinite(model(ids).logits).all()


def _cfg(*extra):
    raw, _ = compose_job(["model=llama-160m", "model.weights=random", *extra])
    return job_config_from_dict(raw)


def test_quality_of_random_weights_is_refused_in_one_line():
    with pytest.raises(ConfigError, match="random weights .* perplexity would mean nothing"):
        _cfg("task=perplexity")
    out = run_cli(["model=llama-2-7b", "model.weights=random", "task=perplexity"])
    assert out.returncode == 1 and out.stderr.strip().count("\n") == 0, out.stderr


def test_a_job_that_cannot_fit_is_refused_before_loading():
    cfg = _cfg("precision=fp32")
    need = memory.check(cfg, available=64 * memory.GB)
    assert need > 0.162e9 * 4
    with pytest.raises(ConfigError, match=r"needs about .* GB of memory and 0\.5 GB is available"):
        memory.check(cfg, available=memory.GB // 2)
    seven = job_config_from_dict(compose_job(["model=llama-2-7b", "model.weights=random", "precision=fp32"])[0])
    assert memory.estimate_bytes(seven) > 25 * memory.GB  # a float32 7B: refused on this 24 GB machine
    w8 = job_config_from_dict(compose_job(["model=llama-2-7b", "model.weights=random", "precision=w8a16"])[0])
    assert memory.estimate_bytes(w8) < 20 * memory.GB


def test_a_gpu_job_is_weighed_against_the_devices_free_memory_and_its_weights_made_there(monkeypatch):
    seven = job_config_from_dict(compose_job(["model=llama-2-7b", "model.weights=random", "precision=bf16"])[0])
    host = memory.estimate_bytes(seven)
    monkeypatch.setattr(memory, "device_free", lambda device: 8 * memory.GB)  # a GPU with 8 GB free
    with pytest.raises(ConfigError, match=r"needs about .* GB of cuda memory and 8\.0 GB is available"):
        memory.check(seven, device="cuda")
    monkeypatch.setattr(memory, "device_free", lambda device: 80 * memory.GB)
    assert memory.check(seven, device="cuda") == host - memory.RUNTIME_BYTES  # the interpreter stays on the host
    model, _ = random_model("llama-160m", device="meta")  # made on the device it is asked for (meta: no memory)
    assert all(p.device.type == "meta" for p in model.parameters())


def test_freed_memory_is_returned_before_the_next_job_is_weighed():
    """glibc keeps freed heap pages (the OS counts them as used): a sweep's later 7B job was refused for it."""
    import psutil

    rss = lambda: psutil.Process().memory_info().rss  # noqa: E731
    chunks = [bytearray(4096) for _ in range(150_000)]  # ~600 MB of small heap allocations
    kept = chunks[::10]  # holes: the heap cannot simply shrink from its top
    del chunks
    before = rss()
    memory.release_freed()
    assert before - rss() > 300 * 2**20, (before, rss())
    assert len(kept) == 15_000


def test_a_quantized_job_of_random_weights_makes_one_layer_at_a_time_and_a_cached_one_none_of_what_it_replaces(
    tmp_path, monkeypatch
):
    """The first job quantizes with its decoder layers unmade, each made as the quantization reaches it and its
    linears dropped once rounded (never two layers' float linears at once); the second finds the quantized weights
    cached and leaves the linears they replace on the meta device, never allocated: only the embedding and the
    norms are made, with the values the whole model has; both jobs' models give the same logits."""
    from src.assembly import memory
    from src.assembly.composed import job_config
    from src.assembly.job import build
    from src.models import random_weights
    from tests.support.cli import fresh_cache

    made: list[list[set[str]]] = []  # per job, what each fill made
    original = random_weights.fill
    most = [0]

    def watched(model, seed=random_weights.SEED, only=None):
        real = {n for n, p in model.named_parameters() if p.device.type != "meta" and p.numel()}
        if only is None:
            made.append([])
        made[-1].append(real if only is None else set(only))
        most[0] = max(most[0], len({n.split(".layers.")[1].split(".")[0] for n in real if "proj" in n}))
        return original(model, seed, only)

    monkeypatch.setattr(random_weights, "fill", watched)
    monkeypatch.setenv("QUANTSPEC_CACHE", str(fresh_cache(tmp_path / "cache")))
    args = ["model=llama-160m", "model.weights=random", "precision=w4a16", "precision.method=rtn",
            "precision.gptq=[]", "task.limit=1", "task.max_new_tokens=2"]  # fmt: skip
    ids = torch.tensor([[1, 5, 9, 77]])
    logits, estimates = [], []
    for _ in range(2):
        estimates.append(memory.estimate_bytes(job_config(args)))
        job = build(job_config(args))
        with torch.inference_mode():
            logits.append(job.model(ids).logits.float())
        assert not [n for n, p in job.model.named_parameters() if p.device.type == "meta"]
    (whole, *layers, head), (second,) = made
    assert not [n for n in whole if ".layers." in n] and len(layers) == 12  # llama-160m's layers, one fill each
    assert head == {"lm_head.weight"} and "lm_head.weight" not in whole  # and its head, last
    assert all(len({n.split(".")[2] for n in names}) == 1 for names in layers)
    assert most[0] <= 1, "two layers' float linears were held at once"
    linears = {n for names in layers for n in names if "proj" in n}
    assert linears and not linears & second  # none of them made the second time
    assert {n for n in second if ".layers." in n} == {n for names in layers for n in names} - linears
    assert torch.equal(logits[0], logits[1])
    # the memory check counts what a cached job holds: its cache, not the float model it no longer makes
    assert estimates[1] < estimates[0]


def test_a_cache_damaged_in_place_is_found_by_the_load_and_rebuilt_by_the_same_job(tmp_path, monkeypatch, caplog):
    """A byte of the quantized weights changed, the size kept: the hollow build's quick look passes it, the load's
    sha256 does not; the job says so in one line and rebuilds the entry, making the float linears it had left
    unmade a layer at a time, with the same logits as before."""
    import logging

    from src.assembly.composed import job_config
    from src.assembly.job import build
    from tests.support.cli import fresh_cache

    monkeypatch.setenv("QUANTSPEC_CACHE", str(fresh_cache(tmp_path / "cache")))
    args = ["model=llama-160m", "model.weights=random", "precision=w4a16", "precision.method=rtn",
            "precision.gptq=[]", "task.limit=1", "task.max_new_tokens=2"]  # fmt: skip
    ids = torch.tensor([[1, 5, 9, 77]])
    with torch.inference_mode():
        before = build(job_config(args)).model(ids).logits.float()
    (weights,) = (tmp_path / "cache" / "quantized").glob("*/layer-00000.safetensors")
    intact = weights.read_bytes()
    data = bytearray(intact)
    data[-1] ^= 0xFF
    weights.write_bytes(bytes(data))
    with caplog.at_level(logging.WARNING, logger="quantspec"), torch.inference_mode():
        again = build(job_config(args)).model(ids).logits.float()
    said = [r.getMessage() for r in caplog.records if "rebuilt" in r.getMessage()]
    assert len(said) == 1 and "layer-00000.safetensors does not match its recorded sha256" in said[0], said
    assert weights.read_bytes() == intact  # rebuilt as it was
    assert torch.equal(before, again)
