"""The static step (engine.step_path=static): the native decoder's greedy tokens on every tiny family, draft
verification and rollback by position, one compiled graph for every position, and how a job runs it."""

from pathlib import Path

import pytest
import torch
import torch._dynamo
from mlflow.tracking import MlflowClient
from torch._dynamo.utils import counters

from src.engine import GENERATE, Sampling, engine_for, native, static_step
from src.engine.generation import Request
from src.engine.speculative import ModelDrafter, PromptLookup
from src.models import families
from src.models.tiny import tiny_model
from src.tracking.sweep.record import run_job
from tests.support.cli import compose_job

ARCHS = families.NAMES  # every family src.models.families describes: a new one is tested here by its file alone


@pytest.mark.parametrize("arch", ARCHS)
def test_greedy_tokens_are_the_native_decoders(arch):
    model, tok = tiny_model(arch)
    # gemma3's sliding window is 32: the long prompt's steps see only the window in its sliding layer
    for prompt, exact in (("def add(a, b):", True), ("x" * 40, False)):
        ids = tok(prompt, return_tensors="pt").input_ids
        ref = GENERATE["native"](model, Request(ids, 24, exact, Sampling(), tok.pad_token_id))
        own = engine_for("native", "static")(model, Request(ids, 24, exact, Sampling(), tok.pad_token_id))
        assert own.new_token_ids == ref.new_token_ids
        assert len(own.token_times) == own.new_tokens and own.token_times == sorted(own.token_times)


def test_a_stop_check_reads_each_token_and_ends_where_it_says():
    model, tok = tiny_model("llama")
    ids = tok("def add(a, b):", return_tensors="pt").input_ids
    ref = GENERATE["native"](model, Request(ids, 20, True, Sampling(), tok.pad_token_id)).new_token_ids
    out = static_step.generate(
        model, Request(ids, 20, True, Sampling(), tok.pad_token_id, stop=lambda new: ref[4] in new)
    )
    assert out.new_token_ids == ref[: ref.index(ref[4]) + 1] and len(out.token_times) == out.new_tokens


@pytest.mark.parametrize("arch", ARCHS)
def test_drafts_verified_and_rolled_back_by_position_keep_the_targets_tokens(arch):
    model, tok = tiny_model(arch)
    ids = tok("def add(a, b): return add(a, b) + add(a, b)", return_tensors="pt").input_ids
    ref = GENERATE["native"](model, Request(ids, 40, True, Sampling(), tok.pad_token_id))
    other = ModelDrafter(tiny_model(arch, seed=1)[0], path="static")  # another model over its own static cache
    for drafter in (PromptLookup(), other, Wrong()):
        own = engine_for("native", "static", drafter, k=4)(model, Request(ids, 40, True, Sampling(), tok.pad_token_id))
        assert own.new_token_ids == ref.new_token_ids
    assert own.spec.proposed > own.spec.accepted + 20  # Wrong's: rejected and rolled back at nearly every step


class Wrong(PromptLookup):
    """Proposes the same four tokens every time: the target keeps few, so nearly every step rolls back."""

    def propose(self, context, k, sample):
        return [5, 6, 7, 8][:k], [None] * min(k, 4)


def test_verify_matches_steps_and_rollback_moves_the_position():
    model, tok = tiny_model("gemma3")
    ids = tok("def f(x):", return_tensors="pt").input_ids
    tokens = [70, 71, 72, 73, 74]
    with torch.inference_mode():
        stepper = static_step.Decoder(model)
        stepper.prefill(ids)
        steps = torch.stack([stepper.step(t) for t in tokens])
        verifier = static_step.Decoder(model)
        verifier.prefill(ids)
        torch.testing.assert_close(verifier.verify(tokens), steps, rtol=1e-4, atol=1e-4)
        verifier.rollback(3)  # keep two of five: the three rows behind stay in the buffer, masked
        assert verifier.length == ids.shape[1] + 2
        torch.testing.assert_close(verifier.step(tokens[2]), steps[2], rtol=1e-4, atol=1e-4)


def test_the_cache_grows_past_its_first_size_and_keeps_the_sequence():
    model, tok = tiny_model("llama")
    ids = tok("a", return_tensors="pt").input_ids
    decoder = static_step.Decoder(model)  # no reserve: sized to the prompt, then grown by the steps
    with torch.inference_mode():
        logits = decoder.prefill(ids)
        first = decoder.cache.capacity
        tokens, eos = [], tok.eos_token_id
        while decoder.length <= first:
            tokens.append(int(logits.index_fill(0, torch.tensor([eos]), float("-inf")).argmax()))  # as exact bans it
            logits = decoder.step(tokens[-1])
    assert first == static_step.ROUND and decoder.cache.capacity > first
    ref = GENERATE["native"](model, Request(ids, len(tokens), True, Sampling(), tok.pad_token_id)).new_token_ids
    assert tokens == ref


def test_compiled_fullgraph_runs_twenty_positions_without_recompiling():
    model, tok = tiny_model("llama")
    ids = tok("def add(a, b): return a", return_tensors="pt").input_ids  # longer than Runner.MAX_CAPTURED: eager
    ref = GENERATE["native"](model, Request(ids, 21, True, Sampling(), tok.pad_token_id))
    torch._dynamo.reset()
    counters.clear()
    try:
        with torch._dynamo.config.patch(error_on_recompile=True):
            out = static_step.generate(
                model, Request(ids, 21, True, Sampling(), tok.pad_token_id), compile=True, backend="aot_eager"
            )
        graphs = counters["stats"]["unique_graphs"]
    finally:
        torch._dynamo.reset()
    assert out.new_token_ids == ref.new_token_ids
    assert graphs == 1  # the one-token step, for all 20 positions after the prompt (which runs eager)


def test_sampling_draws_on_the_device_seeded():
    model, tok = tiny_model("qwen2")
    ids = tok("x", return_tensors="pt").input_ids
    s = Sampling(do_sample=True, temperature=1.5, top_p=0.9, seed=7)
    runs = [
        engine_for("native", "static")(model, Request(ids, 12, True, s, tok.pad_token_id)).new_token_ids
        for _ in range(2)
    ]
    other = engine_for("native", "static")(model, Request(ids, 12, True, Sampling(True, 1.5, 0.9, 8), tok.pad_token_id))
    assert runs[0] == runs[1] and other.new_token_ids != runs[0]


def test_off_the_cpu_quantspecs_step_path_is_the_static_one():
    with torch.device("meta"):  # a model on a device other than the CPU, never run
        model, _ = tiny_model("llama")
    assert native.resolved(model, "cpp") == "static" and native.executed_path(model, "cpp") == "static"
    assert native.resolved(model, "python") == "python"  # asked for by name: kept
    cpu, _ = tiny_model("llama")
    assert native.resolved(cpu, "cpp") == "cpp"


TINY = ["model=tiny-llama", "task=benchmark", "task.prompt_lengths=[16]", "task.max_new_tokens=8", "task.warmup=0"]


def test_a_job_records_the_static_path_and_refuses_compile_elsewhere(store, capsys):
    out = Path(store.removeprefix("sqlite:///")).parent / "out"
    raw, choices = compose_job([*TINY, "engine.step_path=static", "draft=prompt_lookup", f"tracking.uri={store}"])
    assert run_job(raw, choices, sweep=None, output_dir=out) == "finished"
    raw, choices = compose_job([*TINY, "engine.step_path=python", "engine.compile=true", f"tracking.uri={store}"])
    assert run_job(raw, choices, sweep=None, output_dir=out) == "failed"
    err = [line for line in capsys.readouterr().err.splitlines() if line.startswith("quantspec:")]
    assert len(err) == 1 and "engine.compile=true compiles the static step" in err[0], err
    client = MlflowClient(store)
    failed, done = sorted(
        client.search_runs([client.get_experiment_by_name("quantspec").experiment_id]), key=lambda r: r.info.status
    )
    assert done.data.params["executed.step_path"] == "static" and done.data.params["executed.capture"] == "eager"
    assert done.data.metrics["output_identical_fraction"] == 1.0  # the drafts' tokens are the static step's own
    assert failed.info.status == "FAILED"
