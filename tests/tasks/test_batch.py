"""task=batch (src.tasks.batch): B sequences prefilled together then decoded together, on quantspec's batched step
(each sequence's tokens those it decodes alone) or llama-batched-bench (its JSON lines read; a run that fails said
in one line); the job's figures each in the store's catalog."""

import json
import sys

import pytest

from src.assembly.config import ConfigError, job_config_from_dict
from src.assembly.job import build
from src.data.config import DatasetConfig
from src.data.corpus import load_text
from src.engine import batching
from src.tasks import batch
from src.tracking.store import catalog
from tests.engine.test_batching import alone
from tests.engine.tiny import model_at
from tests.support.cli import compose_job, fresh_cache
from tests.support.records import Kept


def test_sequences_prefilled_and_decoded_together_get_the_tokens_each_gets_alone():
    model, tok = model_at("llama", "w4a16")
    prompts = batch.cut(tok, load_text(DatasetConfig("humaneval", "humaneval")), 3, 20)
    assert len({tuple(p) for p in prompts}) == 3 and all(len(p) == 20 for p in prompts)
    step = batching.BatchStep(model)
    seqs = []
    timing = batch._once(step, prompts, 5, budget=8, keep=seqs)
    assert (timing.batch, timing.pp_tokens, timing.tg_tokens) == (3, 60, 15) and timing.pp_s > 0 < timing.tg_s
    for seq, prompt in zip(seqs, prompts, strict=True):
        assert seq.tokens == alone(model, prompt, 6)  # the prefill's first token, then 5 steps


def test_the_configs_bound_on_sequences_is_the_batched_steps():
    from src.tasks import kinds

    assert kinds.MAX_SEQUENCES == batching.MAX_SEQUENCES  # kinds reads it without torch: the two must agree


def test_a_corpus_too_short_for_the_prompts_is_one_line():
    _, tok = model_at("llama", "fp32")
    with pytest.raises(batch.BatchError, match="too few for 4 prompts of 64"):
        batch.cut(tok, "a few words", 4, 64)


# llama-batched-bench's --output-format jsonl line, as its 0.3.36 sources print it
LINE = (
    '{"n_kv_max": 1264, "n_batch": 2048, "n_ubatch": 512, "flash_attn": 0, "is_pp_shared": 0, "n_gpu_layers": 0, '
    '"n_threads": 2, "n_threads_batch": 2, "pp": 128, "tg": 64, "pl": %d, "n_kv": 0, "t_pp": %f, "speed_pp": 0, '
    '"t_tg": %f, "speed_tg": 0, "t": 0, "speed": 0}'
)


def fake(tmp_path, body: str):
    exe = tmp_path / "llama-batched-bench"
    exe.write_text(f"#!{sys.executable}\nimport sys\n{body}\n")
    exe.chmod(0o755)
    return [str(exe)]


def test_llama_batched_benchs_lines_become_timings(tmp_path):
    lines = [LINE % (1, 0.5, 2.0), LINE % (4, 1.6, 2.5)]
    cmd = fake(tmp_path, "print('main: n_kv_max = 1264')\n" + "\n".join(f"print({json.dumps(x)})" for x in lines))
    got = batch._batched_bench(cmd)
    assert got[4].pp_tokens == 512 and got[4].tg_tokens == 256 and got[4].pp_s == 1.6 and got[4].tg_s == 2.5
    assert got[1].figures()["batch_tg_tokens_per_s_b1"] == 32.0


def test_a_failed_llama_batched_bench_is_its_last_line(tmp_path):
    cmd = fake(
        tmp_path,
        "print('loading', file=sys.stderr); print('error: failed to load model', file=sys.stderr)\nsys.exit(1)",
    )
    with pytest.raises(batch.BatchError, match="exited 1: error: failed to load model") as err:
        batch._batched_bench(cmd)
    assert "\n" not in str(err.value)


@pytest.mark.parametrize(
    ("overrides", "words"),
    [
        (["task.batch_sizes=[]"], "task.batch_sizes is empty"),
        (["task.batch_sizes=[1,32]"], r"task\.batch_sizes=32 must be from 1 to 16"),
        (["task.batch_sizes=[2,2]"], "names a size twice"),
        (["task.runner=vllm"], r"task\.runner"),
        (["engine=hf"], "task=batch runs quantspec's batched C.. step"),
    ],
)
def test_a_batch_that_cannot_run_is_refused_naming_what_to_give(overrides, words):
    raw, _ = compose_job(["task=batch", *overrides])
    with pytest.raises(ConfigError, match=words):
        job_config_from_dict(raw)


def test_a_batch_job_logs_each_sizes_figures_each_in_the_catalog(tmp_path):
    raw, _ = compose_job(
        ["model=tiny-gemma3", "precision=fp32", "task=batch", "task.batch_sizes=[1,3]", "task.prompt_tokens=12",
         "task.output_tokens=4", f"cache_dir={fresh_cache(tmp_path / 'cache')}"]
    )  # fmt: skip
    kept = Kept()
    result = build(job_config_from_dict(raw), kept).run()
    figures = result.summary
    assert figures["batch_tg_best_b"] in (1.0, 3.0) and figures["batch_pp_tokens_per_s_b3"] > 0
    assert figures["batch_pp_s_b1"] > 0 and "batch_tg_gain_max" in figures and "batch.md" in result.artifacts
    assert kept.tags["runner"] == "quantspec"
    assert catalog.unlisted("metric", [*figures, *kept.metrics]) == []
    assert catalog.unlisted("tag", kept.tags) == [] and catalog.unlisted("artifact", result.artifacts) == []
