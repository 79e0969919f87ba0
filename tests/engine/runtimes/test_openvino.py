"""engine=openvino: OpenVINO runs the job's own weights, exported by optimum-intel (in its own
environment) and compressed by NNCF at the precision, through the same tasks, timing and records."""

import pytest
import torch
from mlflow.tracking import MlflowClient

from src.engine.generation import Request, Sampling
from src.engine.runtimes import openvino as ov
from src.models.tiny import tiny_model
from src.quality.scoring import torch_scorer
from tests.support.cli import fresh_cache, run_cli
from tests.support.runtimes import fp32_export, perplexity_by_engine

pytestmark = pytest.mark.skipif(ov.available() is not None, reason=str(ov.available()))


@pytest.fixture(scope="module")
def fp32_sweep(tmp_path_factory):
    """`task=perplexity` on the tiny Llama at fp32 on engines native and openvino, in a store and cache of its own:
    each engine's perplexity, the store, and the cache that holds the fp32 export the openvino job made (the
    export test below reads it back rather than paying for a second export of the same weights)."""
    tmp = tmp_path_factory.mktemp("openvino")
    return perplexity_by_engine(tmp, "native,openvino"), f"sqlite:///{tmp / 'mlflow.db'}", tmp / "cache"


def test_the_export_decodes_as_torch_does_scores_as_torch_does_and_is_cached(fp32_sweep):
    _, _, cache = fp32_sweep
    model, tok = tiny_model("llama")  # the weights the sweep's tiny-llama job exported
    folder, manifest = fp32_export(cache, "openvino")
    want = manifest["want"]
    assert want["precision"] == "fp32"
    engine = ov.OpenVINO(folder, (tok.eos_token_id,), f32=True)
    ids = tok("hello world", return_tensors="pt").input_ids
    gen = engine(None, Request(ids, 12, True, Sampling(), tok.pad_token_id))
    with torch.no_grad():
        ref = model.generate(ids, max_new_tokens=12, min_new_tokens=12, do_sample=False, pad_token_id=tok.pad_token_id)
    assert gen.new_token_ids == ref[0, ids.shape[1] :].tolist()  # the same weights, the same greedy tokens
    assert len(gen.token_times) == 12 and gen.start < gen.token_times[0] <= gen.end
    window = torch.tensor(tok("the quick brown fox jumps over the lazy dog").input_ids)
    theirs, ours = engine.window_score(window), torch_scorer(model)(window)
    assert theirs.target_logp.sum().item() == pytest.approx(ours.target_logp.sum().item(), rel=1e-4)
    assert theirs.top1.tolist() == ours.top1.tolist()
    before = (folder / "openvino_model.xml").stat().st_mtime_ns
    assert ov.export(model, tok, want["source"], {"mode": "fp32"}, [], cache) == folder
    assert (folder / "openvino_model.xml").stat().st_mtime_ns == before  # cached, not rebuilt


def test_a_sweep_on_openvino_times_each_precision_and_skips_what_it_cannot_run(tmp_path):
    store = f"sqlite:///{tmp_path / 'mlflow.db'}"
    out = run_cli(
        [
            "-m",
            "model=tiny-llama",
            "engine=openvino",
            "precision=w4a16_int8,w8a8,bf16",  # fp32's export: the perplexity test's below
            "precision.wide_linears=[]",  # NNCF keeps no named linears wider
            "precision.group_size=64",  # the precision's groups, not NNCF's default
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
    assert (
        "sweep done: 2 finished, 1 skipped" in out.stdout
        and "engine openvino has no precision.dtype=bfloat16" in out.stdout
    )
    client = MlflowClient(store)
    runs = client.search_runs(
        [client.get_experiment_by_name("quantspec").experiment_id],
        "tags.`quantspec.role` = 'job' and tags.outcome = 'finished'",
    )
    by = {r.data.tags["precision"]: r for r in runs}
    assert "NNCF int4 weights (asym, group 64) with AWQ" in by["w4a16_int8"].data.params["executed.runtime"]
    assert (
        "NNCF SmoothQuant (alpha 0.5), int8 weights and static int8 activations, its float parts in fp32"
        in by["w8a8"].data.params["executed.runtime"]
    )
    assert all(r.data.metrics["time_per_token_ms_median"] > 0 and r.data.tags["kernels"] == "openvino" for r in runs)


def test_perplexity_on_openvino_matches_torch_on_the_same_fp32_weights(fp32_sweep):
    ppl, store, _ = fp32_sweep
    assert ppl["openvino"] == pytest.approx(ppl["native"], rel=1e-3)
    client = MlflowClient(store)
    (job,) = client.search_runs([client.get_experiment_by_name("quantspec").experiment_id], "tags.engine = 'openvino'")
    assert job.data.params["executed.runtime"].startswith("openvino 2026")
