"""Quality beside speed (src.quality): the divergence arithmetic against a direct computation on a tiny model,
the statistics, the paired tests, the front, and the lm-eval wrapper against torch on the same weights."""

import copy
import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from src.models.tiny import tiny_model
from src.quality import divergence, front, paired, stats
from src.quality.scoring import reference_window, score_logits, torch_scorer


def _window(tok, text="the quick brown fox jumps over the lazy dog and runs far away"):
    return torch.tensor(tok(text).input_ids)


def _perturbed(model, scale=0.05):
    other = copy.deepcopy(model)
    gen = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for p in other.parameters():
            p.add_(torch.randn(p.shape, generator=gen) * scale * p.std())
    return other


@torch.inference_mode()
def test_kl_against_the_full_vocabulary_is_torchs_kl_and_identical_models_agree_exactly():
    model, tok = tiny_model("llama")
    ids = _window(tok)
    ref_logits = model(ids[None]).logits[0]
    other_logits = _perturbed(model)(ids[None]).logits[0]
    ref = reference_window(ref_logits, ids, k=10**6)  # all of the vocabulary kept
    assert ref.indices.shape[-1] == ref.vocab
    kl, tail = divergence.kl_per_token(ref, score_logits(other_logits, ids, ref.indices))
    p_log, q_log = F.log_softmax(ref_logits[:-1].double(), -1), F.log_softmax(other_logits[:-1].double(), -1)
    direct = (p_log.exp() * (p_log - q_log)).sum(-1)
    assert torch.allclose(kl, direct, atol=1e-5) and kl.mean() > 1e-3 and tail.abs().max() == 0
    same, _ = divergence.kl_per_token(ref, score_logits(ref_logits, ids, ref.indices))
    assert same.abs().max() == 0  # identical models: KL 0 ...
    summary = divergence.window_summary(
        same.numpy(),
        (score_logits(ref_logits, ids).top1 == ref.top1).numpy(),
        -ref.target_logp.double().numpy(),
        -ref.target_logp.double().numpy(),
    )
    assert summary["kl_mean"] == 0 and summary["top1_agreement"] == 1.0  # ... and top-1 1.0
    assert summary["delta_perplexity"] == 0 and summary["delta_perplexity_se"] == 0


@torch.inference_mode()
def test_kl_from_a_cut_reference_is_the_coarsened_kl_a_lower_bound_of_the_whole():
    model, tok = tiny_model("llama")
    ids = _window(tok)
    p_logits, q_logits = model(ids[None]).logits[0], _perturbed(model, 0.2)(ids[None]).logits[0]
    k = 8
    ref = reference_window(p_logits, ids, k)
    kl_k, tail = divergence.kl_per_token(ref, score_logits(q_logits, ids, ref.indices))
    p, q = F.softmax(p_logits[:-1].double(), -1), F.softmax(q_logits[:-1].double(), -1)
    whole = (p * (p.log() - q.log())).sum(-1)
    # directly: the two distributions on the reference's top k and one bucket for the rest
    top = p.topk(k, -1).indices
    pk, qk = p.gather(1, top), q.gather(1, top)
    pr, qr = 1 - pk.sum(-1), 1 - qk.sum(-1)
    coarse = (pk * (pk.log() - qk.log())).sum(-1) + pr * (pr.log() - qr.log())
    assert torch.allclose(kl_k, coarse, atol=1e-5)
    assert (kl_k <= whole + 1e-6).all() and torch.allclose(tail, pr, atol=1e-6)


def test_standard_errors_and_intervals():
    x = np.arange(10.0)
    mean, se = stats.mean_se(x)
    assert mean == 4.5 and se == pytest.approx(x.std(ddof=1) / math.sqrt(10))
    value, low, high = stats.quantile_ci(np.linspace(0, 1, 1001), 0.5)
    assert value == pytest.approx(0.5) and low < 0.5 < high and high - low < 0.15
    p, low, high = stats.proportion_ci([1, 1, 0, 0])
    assert p == 0.5 and low == pytest.approx(0.1500, abs=1e-4) and high == pytest.approx(0.8500, abs=1e-4)  # Wilson
    every, low, high = stats.proportion_ci([1] * 20)  # all agree: an interval still, not 1 ± 0
    assert every == 1.0 and high == 1.0 and 0.8 < low < 0.9
    rng = np.random.default_rng(0)
    ref = rng.gamma(2.0, 1.0, 4000)
    d, d_se = stats.delta_perplexity(ref + 0.01, ref)  # the same tokens, each 0.01 nats harder
    assert d == pytest.approx(math.exp(ref.mean()) * (math.exp(0.01) - 1))
    # a constant shift: the covariance cancels all but the spread of the perplexity itself, se(mean) * Δ
    assert d_se == pytest.approx(ref.std(ddof=1) / math.sqrt(ref.size) * d, rel=1e-6)
    _, noisy_se = stats.delta_perplexity(ref + rng.normal(0, 0.5, ref.size), ref)
    assert noisy_se > 0.01


def test_mcnemar_exact_and_the_paired_permutation_test():
    a = np.array([True] * 10 + [False] * 10)
    b = np.array([False] * 10 + [False] * 10)
    m = paired.mcnemar(a, b)  # 10 items only a got: p = 2 / 2**10
    assert m.p == pytest.approx(2 / 1024) and m.difference == 0.5
    assert paired.mcnemar(a, a).p == 1.0
    rng = np.random.default_rng(0)
    base = rng.gamma(2.0, 0.1, 2000)
    same = paired.means(base, base)
    assert same.difference == 0 and same.p == 1.0
    shifted = paired.means(base + 0.01 + rng.normal(0, 0.01, base.size), base)
    assert shifted.low > 0 and shifted.p <= 2 / 2001 + 1e-12 and shifted.bound and shifted.p_text() == "≤ 0.001"
    with pytest.raises(ValueError, match="same examples"):
        paired.means(base, base[:10])


def test_the_front_keeps_what_nothing_beats_on_both():
    points = {
        "fp32": (40.0, 0.0),
        "bf16": (25.0, 0.001),
        "w8a8": (14.0, 0.02),
        "w4a16": (13.0, 0.05),
        "slow_and_bad": (30.0, 0.05),
        "tie": (14.0, 0.03),
        "nan": (math.nan, 0.0),
    }
    assert front.pareto(points) == {"fp32", "bf16", "w8a8", "w4a16"}


def _instances(kind, args):
    from lm_eval.api.instance import Instance

    return [Instance(kind, {}, a, 0, ("t", i, 1)) for i, a in enumerate(args)]


@torch.inference_mode()
def test_the_lm_eval_wrapper_scores_as_torch_does_on_the_same_weights():
    pytest.importorskip("lm_eval", reason="lm-eval not installed (scripts/setup installs it)")
    from src.quality.harness import make_lm

    model, tok = tiny_model("llama")
    lm = make_lm(torch_scorer(model), tok, max_context=512)
    context, continuation = "the quick brown", " fox jumps"
    ((logp, greedy),) = lm.loglikelihood(_instances("loglikelihood", [(context, continuation)]))
    head = tok(context, add_special_tokens=False).input_ids
    whole = tok(context + continuation, add_special_tokens=False).input_ids
    ids = torch.tensor(lm.prefix + whole)
    lp = F.log_softmax(model(ids[None]).logits[0].double(), -1)
    tail = list(range(len(lm.prefix) + len(head), len(ids)))
    assert logp == pytest.approx(sum(lp[t - 1, ids[t]].item() for t in tail), rel=1e-5)
    assert greedy == all(lp[t - 1].argmax().item() == ids[t].item() for t in tail)
    # a trailing space moves to the continuation, as lm-eval's own HF model does
    assert lm.loglikelihood(_instances("loglikelihood", [("the quick brown ", "fox jumps")]))[0][0] == pytest.approx(
        lm.loglikelihood(_instances("loglikelihood", [("the quick brown", " fox jumps")]))[0][0]
    )
    # rolling: every token once, in windows of the context (16) when the text is longer
    text = "the quick brown fox jumps over the lazy dog " * 4
    tokens = tok(text, add_special_tokens=False).input_ids
    assert len(tokens) > 16
    (rolling,) = make_lm(torch_scorer(model), tok, max_context=16).loglikelihood_rolling(
        _instances("loglikelihood_rolling", [(text,)])
    )
    expected, start = 0.0, 0
    while start < len(tokens):
        end = min(len(tokens), start + 15)
        window = torch.tensor((lm.prefix if start == 0 else tokens[start - 1 : start]) + tokens[start:end])
        w = F.log_softmax(model(window[None]).logits[0].double(), -1)
        expected += sum(w[t - 1, window[t]].item() for t in range(1, len(window)))
        start = end
    assert rolling == pytest.approx(expected, rel=1e-5)


def test_the_lm_eval_wrapper_generates_through_the_engine_and_cuts_at_until():
    pytest.importorskip("lm_eval", reason="lm-eval not installed (scripts/setup installs it)")
    from src.quality.harness import make_lm

    model, tok = tiny_model("llama")
    said = tok("yes. no. maybe", add_special_tokens=False).input_ids
    asked = []

    def generate(ids, n, stop):  # an engine that says `said`, one token at a time, until told to stop
        asked.append((ids.shape, n))
        out = []
        for token in said:
            out.append(token)
            if stop(out):
                break
        return out

    lm = make_lm(torch_scorer(model), tok, max_context=64, generate=generate)
    (text,) = lm.generate_until(_instances("generate_until", [("Q: ok?", {"until": ["."], "max_gen_toks": 5})]))
    assert text == "yes" and asked[0][1] == 5
    assert asked[0][0][1] == len(lm.prefix + tok("Q: ok?", add_special_tokens=False).input_ids)  # BOS + the context


def test_paired_comparisons_pair_only_the_same_tokens():
    # two perplexity jobs over other windows (another dataset, another window size) can hold as many tokens:
    # the reference's own NLL token by token tells the same tokens apart from merely as many
    from src.tracking.readback.speed_quality import _same_tokens

    a = {"kl": [0.1, 0.2], "reference_nll": [1.0, 2.0]}
    assert _same_tokens(a, {"kl": [0.3, 0.1], "reference_nll": [1.0, 2.0]})
    assert not _same_tokens(a, {"kl": [0.3, 0.1], "reference_nll": [1.5, 2.0]})
    assert not _same_tokens(a, {"kl": [0.3], "reference_nll": [1.0]})
