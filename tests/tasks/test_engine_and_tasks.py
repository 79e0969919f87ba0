"""The engine's timing and the tasks' examples, on tiny models built in-process."""

import pytest
import torch

from src.data.config import DatasetConfig
from src.data.corpus import SEED_PROMPTS, code_prompts, load_text
from src.engine import GENERATE, Sampling, engine_for, python_step
from src.engine.generation import Request, probabilities
from src.engine.native import Decoder
from src.models import families
from src.models.tiny import TINY_CONTEXT, tiny_model
from src.tasks.benchmark import cut_prompts
from src.tasks.kinds import TASKS
from src.tasks.timed import TaskInputs

ARCHS = families.NAMES  # every family src.models.families describes: a new one is tested here by its file alone
generate = GENERATE["hf"]


@pytest.fixture(scope="module")
def llama():
    return tiny_model("llama")


@pytest.mark.parametrize("arch", ARCHS)
def test_greedy_matches_plain_generate_and_times_every_token(arch):
    model, tok = tiny_model(arch)
    ids = tok("def add(a, b):", return_tensors="pt").input_ids
    gen = generate(model, Request(ids, 12, exact=True, sampling=Sampling(), pad_token_id=tok.pad_token_id))
    plain = model.generate(
        ids,
        attention_mask=torch.ones_like(ids),
        max_new_tokens=12,
        min_new_tokens=12,
        do_sample=False,
        pad_token_id=tok.pad_token_id,
    )
    assert gen.new_token_ids == plain[0, ids.shape[1] :].tolist()
    assert gen.new_tokens == 12 and len(gen.token_times) == 12
    assert gen.start <= gen.token_times[0] and gen.token_times == sorted(gen.token_times)
    assert gen.token_times[-1] <= gen.end


def test_tiny_models_are_deterministic():
    a, _ = tiny_model("qwen2")
    b, _ = tiny_model("qwen2")
    assert all(torch.equal(x, y) for x, y in zip(a.state_dict().values(), b.state_dict().values()))


def test_sampling_is_seeded(llama):
    model, tok = llama
    ids = tok("x", return_tensors="pt").input_ids
    s = Sampling(do_sample=True, temperature=1.5, top_p=0.9, seed=7)
    first = generate(model, Request(ids, 10, True, s, tok.pad_token_id)).new_token_ids
    assert first == generate(model, Request(ids, 10, True, s, tok.pad_token_id)).new_token_ids


def task(kind="benchmark", **kw):
    base = dict(
        name=kind,
        max_new_tokens=5,
        code_max_new_tokens=7,
        exact_new_tokens=True,
        limit=None,
        warmup=0,
        **({"prompt_lengths": (4, 16)} if kind == "benchmark" else {}),
    )
    return TASKS[kind](**{**base, **kw})


def run(inputs):
    """The task of `inputs`, as a job runs it (its kind's own implementation)."""
    return inputs.task.run(inputs)


def inputs(model, tok, t, code=False):
    return TaskInputs(
        model,
        tok,
        t,
        code,
        Sampling(),
        TINY_CONTEXT,
        corpus=lambda: load_text(DatasetConfig("humaneval", "humaneval")),
        generate=GENERATE["native"],
    )


def test_benchmark_prompts_have_exact_lengths(llama):
    _, tok = llama
    corpus = load_text(DatasetConfig("humaneval", "humaneval"))
    prompts = cut_prompts(tok, corpus, [4, 8, 256])
    assert [p.shape[1] for p in prompts] == [4, 8, 256]
    assert prompts[0][0, 0].item() == tok.bos_token_id


def test_benchmark_generates_exactly_and_drops_what_does_not_fit(llama):
    model, tok = llama
    t = task(prompt_lengths=(4, 16, TINY_CONTEXT))
    out = run(inputs(model, tok, t))
    assert [r.prompt_tokens for r in out.rows] == [4, 16]
    assert all(r.new_tokens == 5 for r in out.rows)
    assert out.notes and str(TINY_CONTEXT) in out.notes[0]


def test_repeats_keep_one_row_per_example(llama):
    model, tok = llama
    out = run(inputs(model, tok, task(prompt_lengths=(4, 8), repeats=3)))
    assert [r.prompt_tokens for r in out.rows] == [4, 8] and all(r.new_tokens == 5 for r in out.rows)


def test_benchmark_with_nothing_that_fits_fails(llama):
    model, tok = llama
    with pytest.raises(ValueError, match="fits the model's context"):
        run(inputs(model, tok, task(prompt_lengths=(4000,))))


def test_decode_uses_seed_prompts_or_code_prompts(llama):
    model, tok = llama
    out = run(inputs(model, tok, task("decode", exact_new_tokens=False, limit=2)))
    assert len(out.rows) == 2 and all(r.new_tokens <= 5 for r in out.rows)
    assert SEED_PROMPTS[0] in out.artifacts["responses.jsonl"]
    code = run(inputs(model, tok, task("decode", limit=1), code=True))
    assert code.rows[0].new_tokens == 7
    assert len(SEED_PROMPTS) == 10 and len(code_prompts()) == 13
    assert code_prompts()[0].startswith("from typing import List")


@pytest.mark.parametrize("path", ["transformers", "python", "cpp"])
@pytest.mark.parametrize("exact", [True, False])
@pytest.mark.parametrize("arch", ARCHS)
def test_native_engine_matches_generate_token_for_token(arch, exact, path):
    model, tok = tiny_model(arch)
    # gemma3's sliding window is 32: the short prompt starts on the lean step path and leaves it
    for prompt in ("def add(a, b):", "x" * 40):
        ids = tok(prompt, return_tensors="pt").input_ids
        ref = GENERATE["hf"](model, Request(ids, 24, exact, Sampling(), tok.pad_token_id))
        own = engine_for("native", path)(model, Request(ids, 24, exact, Sampling(), tok.pad_token_id))
        assert own.new_token_ids == ref.new_token_ids
        assert len(own.token_times) == own.new_tokens and own.token_times == sorted(own.token_times)


def test_native_engine_stops_at_end_of_sequence_unless_exact(llama):
    model, tok = llama
    ids = tok("x", return_tensors="pt").input_ids
    # make EOS the argmax after three tokens by biasing its logit
    with torch.no_grad():
        model.lm_head.weight[tok.eos_token_id] += 5.0
    try:
        free = GENERATE["native"](model, Request(ids, 20, False, Sampling(), tok.pad_token_id))
        forced = GENERATE["native"](model, Request(ids, 20, True, Sampling(), tok.pad_token_id))
        ref = GENERATE["hf"](model, Request(ids, 20, False, Sampling(), tok.pad_token_id))
    finally:
        with torch.no_grad():
            model.lm_head.weight[tok.eos_token_id] -= 5.0
    assert free.new_token_ids == ref.new_token_ids and free.new_token_ids[-1] == tok.eos_token_id
    assert free.new_tokens < 20 and forced.new_tokens == 20 and tok.eos_token_id not in forced.new_token_ids


@pytest.mark.parametrize("path", ["transformers", "python"])
@pytest.mark.parametrize("arch", ARCHS)
def test_verify_matches_steps_and_rollback_restores(arch, path):
    model, tok = tiny_model(arch)
    ids = tok("def f(x):", return_tensors="pt").input_ids
    with torch.inference_mode():
        stepper = Decoder(model)
        stepper.prefill(ids)
        tokens = [70, 71, 72, 73, 74]
        step_logits = [stepper.step(t) for t in tokens]
        verifier = Decoder(model, path)
        verifier.prefill(ids)
        block = verifier.verify(tokens)
        torch.testing.assert_close(block, torch.stack(step_logits), rtol=1e-4, atol=1e-4)
        verifier.rollback(3)  # keep two of five
        assert verifier.length == ids.shape[1] + 2
        torch.testing.assert_close(verifier.step(tokens[2]), step_logits[2], rtol=1e-4, atol=1e-4)


def test_native_sampling_is_seeded_and_top_p_filters():
    logits = torch.tensor([3.0, 2.0, 1.0, -5.0])
    p = probabilities(logits, Sampling(do_sample=True, temperature=1.0, top_p=0.8, seed=0))
    assert p[3] == 0 and p[2] == 0 and abs(float(p.sum()) - 1) < 1e-6 and p[0] > p[1] > 0
    model, tok = tiny_model("llama")
    ids = tok("x", return_tensors="pt").input_ids
    s = Sampling(do_sample=True, temperature=1.5, top_p=0.9, seed=7)
    a = GENERATE["native"](model, Request(ids, 10, True, s, tok.pad_token_id)).new_token_ids
    assert a == GENERATE["native"](model, Request(ids, 10, True, s, tok.pad_token_id)).new_token_ids


def test_lean_step_path_covers_gemma3_within_its_window_only_and_the_seeds_families(monkeypatch):
    model, tok = tiny_model("gemma3")
    calls = []
    original = python_step.Steps.__call__
    monkeypatch.setattr(
        python_step.Steps,
        "__call__",
        lambda self, ids, *rest: calls.append(ids.shape[1]) or original(self, ids, *rest),
    )
    ids = tok("y" * 12, return_tensors="pt").input_ids  # 13 tokens with BOS; the window is 32
    engine_for("native", "cpp")(model, Request(ids, 24, True, Sampling(), tok.pad_token_id))
    assert calls and sum(calls) == model.config.sliding_window  # then transformers' forward took over
    # the seeds' families have lean loops too, with no window to leave (their equality with generate
    # is test_native_engine_matches_generate_token_for_token's)
    assert [python_step.for_model(tiny_model(a)[0]).family.name for a in ("llama", "qwen2", "opt")] == [
        "llama",
        "qwen2",
        "opt",
    ]
    post_norm = tiny_model("opt")[0]
    post_norm.config.do_layer_norm_before = False  # OPT-350m's layout: not covered, transformers' forward runs
    assert python_step.for_model(post_norm) is None


def test_a_decode_runs_the_user_s_prompts_from_a_jsonl_file_and_a_bad_line_is_one_line(tmp_path, store):
    """dataset=jsonl: five prompts, three of them chats, in place of the seed prompts; a bad line refused in one
    line naming it, before anything loads and with no run recorded."""
    import json

    from mlflow.tracking import MlflowClient

    from tests.data.test_prompts import FIVE
    from tests.support.cli import run_cli

    path = tmp_path / "mine.jsonl"
    path.write_text("".join(json.dumps(item) + "\n" for item in FIVE))
    quick = ["model=tiny-llama", "dataset=jsonl", f"dataset.path={path}", "task.max_new_tokens=4", "task.warmup=0"]
    out = run_cli([*quick, f"tracking.uri={store}", f"hydra.run.dir={tmp_path / 'run'}"])
    assert out.returncode == 0, out.stderr[-2000:]
    client = MlflowClient(store)
    (run,) = client.search_runs([client.get_experiment_by_name("quantspec").experiment_id])
    lines = client.download_artifacts(run.info.run_id, "responses.jsonl", str(tmp_path))
    shown = [json.loads(line)["prompt"] for line in open(lines)]
    assert shown == ["What is recursion?", "Name a prime.", "2+2?", "Tell me a one line joke.", "How did it all begin?"]
    assert run.data.params["dataset.source"] == "jsonl" and run.data.metrics["examples"] == 5
    assert "no chat template: 3 chat prompt(s)" in out.stdout  # the tiny tokenizer has none: said (logged)
    path.write_text(json.dumps(FIVE[0]) + "\n" + '{"messages": "hi"}\n')
    out = run_cli([*quick, f"tracking.uri={store}", f"hydra.run.dir={tmp_path / 'bad'}"])
    said = [line for line in out.stderr.splitlines() if line.startswith("quantspec:")]
    assert out.returncode == 1 and len(said) == 1 and "Traceback" not in out.stderr
    assert said[0].endswith(f"dataset.path={path} line 2: a chat must be a non-empty list of turns")
    assert len(client.search_runs([client.get_experiment_by_name("quantspec").experiment_id])) == 1  # none added
