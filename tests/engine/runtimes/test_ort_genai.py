"""engine=ort_genai: ONNX Runtime GenAI runs the job's own weights, exported by its model builder at the
precision, through the same tasks, timing and records as every engine; what it cannot run is a skip."""

import shutil

import pytest
import torch
from mlflow.tracking import MlflowClient

from src.engine.generation import Request, Sampling
from src.engine.runtimes import ort_genai
from src.models.tiny import tiny_model
from tests.support.cli import fresh_cache, run_cli
from tests.support.runtimes import fp32_export, perplexity_by_engine

FP32 = {"precision": "fp32", "options": {}}  # ort_genai.target of precision=fp32

FP32 = {"precision": "fp32", "options": {}}  # ort_genai.target of precision=fp32

pytestmark = pytest.mark.skipif(ort_genai.available() is not None, reason=str(ort_genai.available()))


@pytest.fixture(scope="module")
def fp32_sweep(tmp_path_factory):
    """`task=perplexity` on the tiny Llama at fp32 on engines native and ort_genai, in a store and cache of its own:
    each engine's perplexity, and the cache that holds the fp32 export the ort_genai job made (the export tests
    below read it back, or damage a copy of it, rather than paying for more exports of the same weights)."""
    tmp = tmp_path_factory.mktemp("ort_genai")
    return perplexity_by_engine(tmp, "native,ort_genai"), tmp / "cache"


def test_the_export_greedy_decodes_as_torch_does_and_is_cached(fp32_sweep):
    _, cache = fp32_sweep
    model, tok = tiny_model("llama")  # the weights the sweep's tiny-llama job exported
    folder, manifest = fp32_export(cache, "ort_genai")
    assert manifest["want"]["precision"] == "fp32" and (folder / "genai_config.json").is_file()
    assert manifest["files"]["model.onnx"]["bytes"] == (folder / "model.onnx").stat().st_size
    engine = ort_genai.OrtGenAI(folder, "cpu")
    ids = tok("hello world", return_tensors="pt").input_ids
    gen = engine(None, Request(ids, 12, True, Sampling(), tok.pad_token_id))
    with torch.no_grad():
        ref = model.generate(ids, max_new_tokens=12, min_new_tokens=12, do_sample=False, pad_token_id=tok.pad_token_id)
    assert gen.new_token_ids == ref[0, ids.shape[1] :].tolist()  # the same weights, the same greedy tokens
    assert gen.new_tokens == 12 and len(gen.token_times) == 12 and gen.start < gen.token_times[0] <= gen.end
    # its own logits score a window as torch's do
    from src.quality.scoring import torch_scorer

    window = torch.tensor(tok("the quick brown fox jumps over the lazy dog").input_ids)
    theirs, ours = engine.window_score(window), torch_scorer(model)(window)
    assert theirs.target_logp.sum().item() == pytest.approx(ours.target_logp.sum().item(), rel=1e-4)
    assert theirs.top1.tolist() == ours.top1.tolist()
    before = (folder / "model.onnx").stat().st_mtime_ns
    assert ort_genai.export(model, tok, manifest["want"]["source"], FP32, "cpu", cache) == folder
    assert (folder / "model.onnx").stat().st_mtime_ns == before  # cached, not rebuilt


def test_a_sweep_across_engines_times_each_and_skips_what_a_runtime_cannot_run(tmp_path):
    store = f"sqlite:///{tmp_path / 'mlflow.db'}"
    out = run_cli(
        [
            "-m",
            "model=tiny-llama",
            "engine=native,ort_genai",
            "precision=fp32,rtn,bf16",
            "precision.wide_linears=[]",  # the builder keeps no named linears wider: rtn's 4-bit body, its int8 head
            "task=benchmark",
            "task.prompt_lengths=[4,8]",
            "task.max_new_tokens=4",
            "task.warmup=0",
            f"tracking.uri={store}",
            f"hydra.sweep.dir={tmp_path / 'sweep'}",
        ],
        env={"QUANTSPEC_CACHE": str(fresh_cache(tmp_path / "cache"))},
    )
    assert out.returncode == 0, out.stderr[-2000:]
    assert "sweep done: 5 finished, 1 skipped" in out.stdout
    assert "skipped: engine ort_genai has no precision.dtype=bfloat16" in out.stdout
    client = MlflowClient(store)
    runs = client.search_runs(
        [client.get_experiment_by_name("quantspec").experiment_id],
        "tags.`quantspec.role` = 'job' and tags.engine = 'ort_genai'",
    )
    done = [r for r in runs if r.data.tags["outcome"] == "finished"]
    assert sorted(r.data.tags["precision"] for r in done) == ["fp32", "rtn"]
    for run in done:
        assert run.data.params["executed.runtime"].startswith("onnxruntime-genai 0.18")
        assert run.data.tags["kernels"] == "onnxruntime" and run.info.run_name.endswith("·ort_genai")
        assert run.data.metrics["time_per_token_ms_median"] > 0 and run.data.metrics["export_s"] > 0
    assert (
        "int4 MatMulNBits in blocks of 128, fp32 activations, the head int8"
        in next(r for r in done if r.data.tags["precision"] == "rtn").data.params["executed.runtime"]
    )


def test_perplexity_on_the_runtime_matches_torch_on_the_same_fp32_weights(fp32_sweep):
    ppl, _ = fp32_sweep
    assert ppl["ort_genai"] == pytest.approx(ppl["native"], rel=1e-3)


def test_a_damaged_export_is_rebuilt_with_one_line_and_a_killed_builds_folder_cleared(fp32_sweep, tmp_path, caplog):
    model, tok = tiny_model("llama")
    built, manifest = fp32_export(fp32_sweep[1], "ort_genai")
    folder = tmp_path / "ort_genai" / built.name  # a copy of the sweep's export, damaged here
    shutil.copytree(built, folder)
    source = manifest["want"]["source"]
    data = max((p for p in folder.iterdir() if p.is_file()), key=lambda p: p.stat().st_size)  # the weights
    with data.open("r+b") as f:  # bytes flipped in the middle of the weights: the 50 KB
        f.seek(data.stat().st_size // 2)
        f.write(b"\xff" * min(50_000, data.stat().st_size // 4))
    orphan = folder.with_name(f".{folder.name}.999999999.tmp")  # a build killed mid-way (it held the lock no more)
    orphan.mkdir()
    with caplog.at_level("WARNING"):
        assert ort_genai.export(model, tok, source, FP32, "cpu", tmp_path) == folder
    assert f"is rebuilt: {data.name} does not match its recorded sha256" in caplog.text
    assert not orphan.exists()
    engine = ort_genai.OrtGenAI(folder, "cpu")
    from src.quality.scoring import torch_scorer

    window = torch.tensor(tok("the quick brown fox jumps over the lazy dog").input_ids)
    assert engine.window_score(window).target_logp.sum().item() == pytest.approx(
        torch_scorer(model)(window).target_logp.sum().item(), rel=1e-4
    )  # the rebuilt export scores as torch
    (folder / "quantspec-cache.json").write_text("null")  # a manifest that is no object
    with caplog.at_level("WARNING"):
        ort_genai.export(model, tok, source, FP32, "cpu", tmp_path)
    assert "its manifest records no files" in caplog.text
