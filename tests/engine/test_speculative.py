"""Speculative decoding: greedy output is exactly the target's whatever the drafter; the sampling rule
keeps the target's distribution (chi-square); drafts are configured, refused when their tokenizer
differs, and measured against the same job without them."""

import math
from pathlib import Path

import pytest
import torch
from mlflow.tracking import MlflowClient

from src.assembly.config import ConfigError, job_config_from_dict
from src.assembly.overrides import composition_problem
from src.engine import GENERATE, Sampling, engine_for
from src.engine.generation import Request
from src.engine.leviathan import alpha_from_accepted, expected_speedup, tokens_per_step
from src.engine.speculative import ModelDrafter, PromptLookup, Schedule, accept_or_resample, generate
from src.models import families
from src.models import load as models
from src.models.tiny import byte_tokenizer, tiny_model
from src.tracking.sweep.record import run_job
from tests.support.cli import compose_job

ARCHS = families.NAMES  # every family src.models.families describes: a new one is tested here by its file alone


def drafters(arch):
    other, _ = tiny_model(arch, seed=1)  # a different model: low acceptance
    same, _ = tiny_model(arch)  # the target itself: everything accepted
    low = tiny_model(arch)[0].to(torch.bfloat16)  # self-speculation at a lower precision
    return {
        "prompt_lookup": PromptLookup(),
        "other": ModelDrafter(other),
        "same": ModelDrafter(same),
        "bf16_self": ModelDrafter(low),
        "fast_self": ModelDrafter(same, path="cpp"),
    }


@pytest.mark.parametrize("exact", [True, False])
@pytest.mark.parametrize("arch", ARCHS)
def test_greedy_output_is_the_targets(arch, exact):
    model, tok = tiny_model(arch)
    ids = tok("def add(a, b):\n    return a + b\n\ndef add(a, b):", return_tensors="pt").input_ids
    ref = GENERATE["native"](model, Request(ids, 20, exact, Sampling(), tok.pad_token_id)).new_token_ids
    for name, drafter in drafters(arch).items():
        for k, schedule in ((1, "constant"), (4, "constant"), (2, "heuristic")):
            gen = generate(
                model,
                Request(ids, 20, exact, Sampling(), tok.pad_token_id),
                drafter=drafter,
                k=k,
                schedule=schedule,
                path="cpp" if name == "fast_self" else "transformers",
            )
            assert gen.new_token_ids == ref, (name, k, schedule)
            assert len(gen.token_times) == gen.new_tokens and gen.token_times == sorted(gen.token_times)
            stats = gen.spec
            assert stats.steps == len(stats.per_step) and stats.accepted == sum(stats.per_step)
            if name == "same":
                assert stats.acceptance_rate == 1.0 and stats.steps < gen.new_tokens


def test_the_engine_function_has_the_plain_engines_call_shape():
    model, tok = tiny_model("llama")
    ids = tok("abcabcabc", return_tensors="pt").input_ids
    spec = engine_for("native", "transformers", PromptLookup(), k=3)
    gen = spec(model, Request(ids, 12, True, Sampling(), tok.pad_token_id))
    assert gen.new_token_ids == GENERATE["native"](model, Request(ids, 12, True, Sampling(), None)).new_token_ids
    assert gen.spec.proposed > 0
    with pytest.raises(ValueError, match="native"):
        engine_for("hf", "transformers", PromptLookup(), k=3)


def test_prompt_lookup_finds_the_latest_ngram():
    lookup = PromptLookup(max_ngram=2)
    assert lookup.propose([1, 2, 3, 4, 1, 2], 3, None) == ([3, 4, 1], [None] * 3)
    assert lookup.propose([5, 6, 7], 3, None) == ([], [])
    assert lookup.propose([1, 2, 9, 1, 2, 8, 1, 2], 1, None) == ([8], [None])


def test_heuristic_schedule_grows_on_full_acceptance_and_shrinks_otherwise():
    plan = Schedule(4, "heuristic", k_max=7)
    plan.update(4, 4)
    assert plan.k == 6
    plan.update(6, 6)
    assert plan.k == 7
    plan.update(7, 2)
    assert plan.k == 6
    fixed = Schedule(4)
    fixed.update(4, 0)
    assert fixed.k == 4


# --- the sampling rule -------------------------------------------------------------------------------


def chi_square_p(counts: torch.Tensor, expected: torch.Tensor) -> float:
    """Pearson's test, bins with an expected count under 5 merged into one."""
    small = expected < 5
    if small.any():
        counts = torch.cat([counts[~small], counts[small].sum().reshape(1)])
        expected = torch.cat([expected[~small], expected[small].sum().reshape(1)])
    stat = float(((counts - expected) ** 2 / expected).sum())
    dof = len(counts) - 1
    return float(torch.special.gammaincc(torch.tensor(dof / 2), torch.tensor(stat / 2)))


@pytest.mark.parametrize("draft_kind", ["model", "point_mass"])
def test_sampling_rule_emits_the_targets_distribution(draft_kind):
    g = torch.Generator().manual_seed(0)
    vocab, k, trials = 6, 3, 20000
    p = torch.softmax(torch.randn(k + 1, vocab, generator=g) * 1.5, dim=-1)
    q = torch.softmax(torch.randn(k, vocab, generator=g) * 1.5, dim=-1)
    first = torch.zeros(vocab)
    kept_counts = torch.zeros(k + 1)
    for _ in range(trials):
        if draft_kind == "model":
            draft = [int(torch.multinomial(q[i], 1, generator=g)) for i in range(k)]
            dists = list(q)
        else:  # prompt lookup: a fixed proposal, q a point mass
            draft, dists = [2, 0, 5], [None] * k
        kept, nxt = accept_or_resample(p, draft, dists, g)
        emitted = draft[:kept] + [nxt]
        first[emitted[0]] += 1
        kept_counts[kept] += 1
    # The first emitted token must follow p[0] exactly, whatever q was.
    assert chi_square_p(first, p[0] * trials) > 0.001
    # And the number kept must follow the rule's acceptance probabilities (sum_x min(p, q)).
    if draft_kind == "model":
        accept = torch.minimum(p[:k], q).sum(-1)
        probs = [1 - accept[0]]
        for i in range(1, k):
            probs.append(accept[:i].prod() * (1 - accept[i]))
        probs.append(accept.prod())
        assert chi_square_p(kept_counts, torch.stack(probs) * trials) > 0.001


def test_chi_square_helper_rejects_a_wrong_distribution():
    counts = torch.tensor([700.0, 300.0])
    assert chi_square_p(counts, torch.tensor([500.0, 500.0])) < 1e-6
    assert chi_square_p(counts, torch.tensor([700.0, 300.0])) > 0.99


def test_speculative_sampling_on_a_tiny_model_matches_plain_sampling():
    """Second new token (the first that speculation decides), over many seeds: plain against speculative
    with a different tiny model drafting (low acceptance: both branches of the rule run)."""
    model, tok = tiny_model("llama")
    drafter = ModelDrafter(tiny_model("llama", seed=1)[0])
    ids = tok("def f(x):", return_tensors="pt").input_ids
    n = 400
    plain, spec = torch.zeros(model.config.vocab_size), torch.zeros(model.config.vocab_size)
    proposed = 0
    for seed in range(n):
        sampling = Sampling(do_sample=True, temperature=1.5, seed=seed)
        plain[GENERATE["native"](model, Request(ids, 5, True, sampling, None)).new_token_ids[1]] += 1
        gen = generate(
            model,
            Request(ids, 5, True, Sampling(do_sample=True, temperature=1.5, seed=10_000 + seed), None),
            drafter=drafter,
            k=3,
        )
        spec[gen.new_token_ids[1]] += 1
        proposed += gen.spec.proposed
    assert proposed > 0
    # two-sample chi-square over the tokens either side drew at least 5 times (the rest merged)
    keep = (plain + spec) >= 10
    a = torch.cat([plain[keep], plain[~keep].sum().reshape(1)])
    b = torch.cat([spec[keep], spec[~keep].sum().reshape(1)])
    expected = (a + b) / 2
    stat = float((((a - expected) ** 2 + (b - expected) ** 2) / expected.clamp(min=1e-9)).sum())
    p_value = float(torch.special.gammaincc(torch.tensor((len(a) - 1) / 2), torch.tensor(stat / 2)))
    assert p_value > 0.001


# --- Leviathan's estimate ------------------------------------------------------------------------------


def test_expected_speedup_follows_the_paper():
    assert tokens_per_step(0.0, 4) == 1.0 and tokens_per_step(1.0, 4) == 5.0
    assert expected_speedup(0.8, 4, 0.0) == pytest.approx((1 - 0.8**5) / 0.2)
    assert expected_speedup(0.8, 4, 0.05) == pytest.approx((1 - 0.8**5) / 0.2 / 1.2)
    assert expected_speedup(0.0, 4, 0.5) == pytest.approx(1 / 3)
    for alpha in (0.1, 0.5, 0.9):
        assert alpha_from_accepted(tokens_per_step(alpha, 3) - 1, 3) == pytest.approx(alpha, abs=1e-6)
    assert math.isnan(expected_speedup(math.nan, 4, 0.1))


# --- config, tokenizer refusal, and a whole job -----------------------------------------------------

TINY = ["model=tiny-llama", "task=benchmark", "task.prompt_lengths=[16,32]", "task.max_new_tokens=12", "task.warmup=0"]


def test_drafts_resolve_their_model_and_precision():
    raw, _ = compose_job([*TINY, "draft=self_w4a16"])
    cfg = job_config_from_dict(raw)
    assert cfg.draft_model.name == "tiny-llama" and cfg.draft_precision.name == "w4a16"
    assert cfg.draft_precision.quant.format == "w4a16" and cfg.draft.k == 4
    raw, _ = compose_job([*TINY, "draft=self_w4a16", "+model@draft.model=tiny-opt", "precision@draft.precision=bf16"])
    cfg = job_config_from_dict(raw)
    assert cfg.draft_model.arch == "opt" and cfg.draft_precision.dtype == "bfloat16"
    raw, _ = compose_job([*TINY, "draft=prompt_lookup"])
    assert job_config_from_dict(raw).draft_model is None


def test_bad_draft_settings_get_one_line():
    assert "unknown precision 'w3a3'" in composition_problem(["draft=self_w4a16", "precision@draft.precision=w3a3"])
    raw, _ = compose_job([*TINY, "draft=self_w4a16", "draft.precision.awq_grid=0"])
    with pytest.raises(ConfigError, match=r"precision.awq_grid=0 must be at least 1"):
        job_config_from_dict(raw)
    raw, _ = compose_job([*TINY, "draft=prompt_lookup", "engine=hf"])
    with pytest.raises(ConfigError, match="use engine=native"):
        job_config_from_dict(raw)
    raw, _ = compose_job([*TINY, "draft=prompt_lookup", "draft.k=0"])
    with pytest.raises(ConfigError, match="draft.k=0"):
        job_config_from_dict(raw)
    raw, _ = compose_job([*TINY, "draft=prompt_lookup", "task=perplexity"])
    assert "does not decode" in job_config_from_dict(raw).unsupported_reason()


def test_tokenizer_mismatch_names_the_difference():
    a, b = byte_tokenizer(), byte_tokenizer()
    assert models.tokenizer_mismatch(a, b) is None
    b.add_tokens(["<extra>"])
    assert "vocabularies of 260 and 259" in models.tokenizer_mismatch(a, b)


def test_a_draft_with_another_tokenizer_is_refused_with_one_line(store, monkeypatch, capsys):
    real = models.tiny_model

    def with_extra_token(arch, *args):  # the draft's family has another vocabulary
        model, tok = real(arch, *args)
        if arch == "opt":
            tok.add_tokens(["<extra>"])
        return model, tok

    monkeypatch.setattr(models, "tiny_model", with_extra_token)
    raw, choices = compose_job(
        [
            *TINY,
            "draft=self_w4a16",
            "+model@draft.model=tiny-opt",
            "precision@draft.precision=fp32",
            f"tracking.uri={store}",
        ]
    )
    assert (
        run_job(raw, choices, sweep=None, output_dir=Path(store.removeprefix("sqlite:///")).parent / "out") == "failed"
    )
    err = [line for line in capsys.readouterr().err.splitlines() if line.startswith("quantspec:")]
    assert len(err) == 1 and "does not share tiny-llama's tokenizer (vocabularies of 260 and 259" in err[0]


def test_a_draft_job_logs_acceptance_speedup_and_the_estimate(store):
    raw, choices = compose_job([*TINY, "draft=self_w8a8", "precision=bf16", f"tracking.uri={store}"])
    assert (
        run_job(raw, choices, sweep=None, output_dir=Path(store.removeprefix("sqlite:///")).parent / "out")
        == "finished"
    )
    client = MlflowClient(store)
    (run,) = client.search_runs([client.get_experiment_by_name("quantspec").experiment_id])
    m = run.data.metrics
    assert m["output_identical_fraction"] == 1.0  # greedy: the draft never changes the output
    assert 0 <= m["acceptance_rate_overall"] <= 1
    assert 1 <= m["draft_k_mean_overall"] <= 4  # fewer near the last token
    assert m["speedup_vs_no_draft_median"] == pytest.approx(
        m["baseline_time_per_token_ms_median"] / m["time_per_token_ms_median"]
    )
    assert m["expected_speedup"] > 0 and m["draft_cost_ratio"] > 0 and 0 <= m["alpha_estimated"] <= 1
    for name in (
        "acceptance_rate",
        "accepted_per_step",
        "draft_ms_per_step",
        "verify_ms_per_step",
        "speedup_vs_no_draft",
        "baseline_time_per_token_ms",
    ):
        assert sorted(p.step for p in client.get_metric_history(run.info.run_id, f"by_example/{name}")) == [1, 2], name
    assert "draft_quantize_s" in m or "draft_quant_load_s" in m


def test_a_cut_down_draft_head_keeps_greedy_output_and_proposes_only_kept_tokens():
    from src.engine.subset_head import SubsetHead, cut_head, frequent_tokens
    from src.quant.linear import W8A8Linear, int8_tensors

    model, tok = tiny_model("llama")
    draft, _ = tiny_model("llama")
    corpus = "def add(a, b):\n    return a + b\n" * 4 + "print(add(1, 2))\n" * 4
    ids = frequent_tokens(tok, corpus, 12)
    assert len(ids) <= 12 + 3 and tok.eos_token_id in ids.tolist()
    cut_head(draft, ids)
    prompt = tok("def add(a, b):", return_tensors="pt").input_ids
    with torch.inference_mode():
        logits = draft(prompt).logits[0, -1]
    outside = torch.ones_like(logits, dtype=torch.bool)
    outside[ids] = False
    assert torch.isinf(logits[outside]).all() and torch.isfinite(logits[ids]).all()
    ref = GENERATE["native"](model, Request(prompt, 16, True, Sampling(), None)).new_token_ids
    gen = generate(model, Request(prompt, 16, True, Sampling(), None), drafter=ModelDrafter(draft), k=3)
    assert gen.new_token_ids == ref
    # the draft's head took in the prompt's tokens for that generation
    head = draft.get_output_embeddings()
    assert set(prompt[0].tolist()) <= set(head.ids.tolist()) and set(ids.tolist()) <= set(head.ids.tolist())
    # an int8 head is cut by rows too, to the same logits as the full one at the kept ids
    w = torch.randn(40, 64)
    full = W8A8Linear(**int8_tensors(w, None))
    x = torch.randn(2, 64)
    torch.testing.assert_close(SubsetHead(full, torch.tensor([3, 7, 30]))(x)[:, [3, 7, 30]], full(x)[:, [3, 7, 30]])
