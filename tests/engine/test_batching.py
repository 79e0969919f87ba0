"""Continuous batching (src.engine.batching, step.cpp's batch_*): sequences of different lengths arriving at
different steps, decoded together with their prompts fed in chunks, each get the greedy tokens they get
decoded alone, on every precision, family and kernel variant this host runs."""

import pytest
import torch

from src import kernels
from src.engine import Sampling, batching, cpp_step, native
from src.engine.generation import Request
from src.kernels import variants
from src.models.tiny import tiny_model
from tests.engine.tiny import PRECISIONS, model_at
from tests.support.kernels import KERNELS as CACHE
from tests.support.kernels import use_variant as use

PROMPTS = [[2, 17, 33], [2, 90, 91, 92, 93, 94, 95], list(range(2, 14)), list(range(40, 56)), list(range(60, 100))]
NEW = [9, 5, 12, 7, 6]


@pytest.fixture(params=[v.name for v in variants.for_arch()])
def isa(request):
    """Every kernel variant this CPU runs; one it lacks is skipped, saying which instructions."""
    return use(request.param)


@pytest.fixture(scope="module", autouse=True)
def best_variant_after():
    yield
    kernels.load(CACHE)


def alone(model, prompt: list[int], new: int) -> list[int]:
    """The prompt's greedy tokens decoded by itself: engine=native's loop on the C++ step (a prompt over 16
    tokens, which native.generate prefills through transformers' forward, through the C++ step in pieces)."""
    if len(prompt) <= native.Decoder.MAX_FAST:
        request = Request(torch.tensor([prompt]), new, False, Sampling(), 0, None)
        return native.generate(model, request, path="cpp").new_token_ids
    compiled, eos = cpp_step.for_model(model), batching.eos_ids(model)
    kv = compiled.new_cache()
    with torch.inference_mode():
        tokens = [int(compiled(torch.tensor([prompt]), kv, 1)[-1].float().argmax())]
        while len(tokens) < new and tokens[-1] not in eos:
            tokens.append(compiled.greedy(torch.tensor([[tokens[-1]]]), kv, torch.tensor([], dtype=torch.long)))
    return tokens


def together(model, max_sequences=3, max_batch_tokens=8, sampling=None) -> tuple[list[list[int]], list[str]]:
    """PROMPTS through one Scheduler: two at first, two more after three steps, the longest after five; fewer
    slots than sequences, so some wait, and prompts fed in chunks beside other sequences' decode rows."""
    out = [[] for _ in PROMPTS]
    reasons = [None] * len(PROMPTS)

    def emitter(i):
        def emit(token, done):
            if token is not None:
                out[i].append(token)
            reasons[i] = done

        return emit

    scheduler = batching.Scheduler(batching.BatchStep(model), max_sequences, max_batch_tokens)
    seqs = [
        batching.Sequence(p, n, emitter(i), sampling=sampling or Sampling())
        for i, (p, n) in enumerate(zip(PROMPTS, NEW))
    ]
    arrivals = {0: seqs[:2], 3: seqs[2:4], 5: seqs[4:]}
    for step in range(200):
        for seq in arrivals.get(step, []):
            scheduler.add(seq)
        if scheduler.step() == 0 and step > 5:
            break
    assert scheduler.idle
    return out, reasons


@pytest.mark.parametrize("precision", PRECISIONS)
@pytest.mark.parametrize("arch", ["gemma3", "llama", "qwen2"])
def test_each_sequence_batched_gets_the_tokens_it_gets_alone(isa, arch, precision):
    model, _ = model_at(arch, precision)
    batched, reasons = together(model)
    for prompt, new, got, reason in zip(PROMPTS, NEW, batched, reasons, strict=True):
        expected = alone(model, prompt, new)
        assert got == expected, f"prompt of {len(prompt)} tokens"
        assert reason == ("stop" if got[-1] in batching.eos_ids(model) else "length")


def test_a_step_holds_every_decoding_sequence_and_prompt_chunks_up_to_its_budget():
    model, _ = model_at("llama", "fp32")
    scheduler = batching.Scheduler(batching.BatchStep(model), max_sequences=2, max_batch_tokens=5)
    seqs = [batching.Sequence(list(range(2, 2 + n)), 4, lambda t, d: None) for n in (3, 9, 2)]
    for seq in seqs:
        scheduler.add(seq)
    plan = scheduler.plan()
    # two slots: the third waits; the first prompt whole, the second's first two tokens (5 rows in all)
    assert [(len(tokens), emits) for _, tokens, emits in plan] == [(3, True), (2, False)]
    assert list(scheduler.waiting) == [seqs[2]]
    scheduler.step()
    plan = scheduler.plan()
    assert [(seq is seqs[0], len(tokens)) for seq, tokens, _ in plan] == [(True, 1), (False, 4)]


def test_a_prompt_longer_than_a_steps_budget_alone_is_fed_over_steps_that_emit_nothing(isa):
    model, _ = model_at("gemma3", "w4a16")
    prompt, got = PROMPTS[-1], []
    scheduler = batching.Scheduler(batching.BatchStep(model), max_batch_tokens=8)
    scheduler.add(batching.Sequence(prompt, 6, lambda t, d: got.append(t)))
    while not scheduler.idle:
        scheduler.step()
    assert scheduler.steps == len(prompt) // 8 + 5 and got == alone(model, prompt, 6)


def test_the_oldest_prompt_advances_even_when_decode_rows_fill_the_budget():
    model, _ = model_at("llama", "fp32")
    scheduler = batching.Scheduler(batching.BatchStep(model), max_sequences=3, max_batch_tokens=2)
    for n in (1, 1, 5):
        scheduler.add(batching.Sequence(list(range(2, 2 + n)), 9, lambda t, d: None))
    scheduler.step()  # the two one-token prompts: 2 rows, the budget
    plan = scheduler.plan()  # two decode rows fill it; the third prompt still gets a row
    assert [len(tokens) for _, tokens, _ in plan] == [1, 1, 1]


def test_a_cancelled_sequence_leaves_and_frees_its_place():
    model, _ = model_at("gemma3", "fp32")
    scheduler = batching.Scheduler(batching.BatchStep(model), max_sequences=1)
    got = []
    first = batching.Sequence([2, 5, 6], 50, lambda t, d: got.append(("first", t, d)))
    second = batching.Sequence([2, 7], 2, lambda t, d: got.append(("second", t, d)))
    scheduler.add(first)
    scheduler.add(second)
    scheduler.step()
    first.cancelled = True
    while not scheduler.idle:
        scheduler.step()
    assert [who for who, _, _ in got] == ["first", "second", "second"]
    assert got[-1][2] == "length" and first.cache is None


def test_sampled_and_greedy_sequences_share_a_step_and_ignore_eos_runs_to_length():
    model, _ = model_at("gemma3", "bf16")
    sampled, _ = together(model, sampling=Sampling(do_sample=True, temperature=0.8, seed=3))
    again, _ = together(model, sampling=Sampling(do_sample=True, temperature=0.8, seed=3))
    assert sampled == again  # each sequence's own seeded generator: the same draws in any company
    eos = sorted(batching.eos_ids(model))[0]
    scheduler = batching.Scheduler(batching.BatchStep(model))
    got = []
    seq = batching.Sequence([2, eos], 6, lambda t, d: got.append(d), ignore_eos=True)
    scheduler.add(seq)
    while not scheduler.idle:
        scheduler.step()
    assert len(seq.tokens) == 6 and eos not in seq.tokens and got[-1] == "length"


def test_a_model_without_the_cpp_step_is_refused_in_one_line():
    plain, _ = tiny_model("opt")
    with pytest.raises(batching.Unbatchable, match="engine=native"):
        batching.BatchStep(plain)


@pytest.mark.parametrize("when", ["prefill", "decode"])
def test_a_sequence_whose_step_raises_ends_alone_and_the_others_get_their_own_tokens(when):
    """A seed torch cannot take (the server refuses it; here it reaches the step) raises in the batched step
    that draws its first token: the step is undone and run again row by row, so only that sequence ends, with
    the error, and every other gets the greedy tokens it gets decoded alone, on the step it shared and after."""
    model, _ = model_at("gemma3", "w4a16")
    out = {i: [] for i in range(3)}
    ends = {}

    def emitter(i):
        def emit(token, done):
            if token is not None:
                out[i].append(token)
            if done:
                ends[i] = done

        return emit

    scheduler = batching.Scheduler(batching.BatchStep(model), max_sequences=4, max_batch_tokens=32)
    victims = [batching.Sequence(PROMPTS[i], NEW[i], emitter(i)) for i in range(2)]
    for seq in victims:
        scheduler.add(seq)
    if when == "decode":  # the victims are decoding when the bad one arrives
        scheduler.step()
    bad = batching.Sequence([2, 5, 7], 5, emitter(2), sampling=Sampling(do_sample=True, temperature=1.0, seed=1 << 64))
    scheduler.add(bad)
    while not scheduler.idle:
        scheduler.step()
    assert ends[2].startswith("error: ValueError: Overflow") and out[2] == [] and "\n" not in ends[2]
    for i in range(2):
        assert out[i] == alone(model, PROMPTS[i], NEW[i]) and not ends[i].startswith("error")


def _batched_logits(model, prompts: list[list[int]]) -> torch.Tensor:
    """Each prompt fed by itself into its own cache (the C++ step, 16-bit), then one batched call of each
    prompt's last token: its logits [len(prompts), V]."""
    compiled = cpp_step.for_model(model)
    caches = []
    with torch.inference_mode():
        for p in prompts:
            kv = compiled.new_cache()
            compiled(torch.tensor([p[:-1]]), kv, 1)
            caches.append(kv)
        ids = torch.tensor([p[-1] for p in prompts])
        compiled._tables(max(len(p) for p in prompts) + 1)
        return compiled.stepper.batch_logits(ids, caches, [1] * len(prompts), [1] * len(prompts)).float()


@pytest.mark.parametrize("arch", ["gemma3", "llama"])
def test_int8_batch_activations_keep_each_row_its_own_and_near_the_16_bit_step(isa, arch):
    """precision.batch_activations=int8: a batched step of X8_ROWS rows or more takes the int8 GEMM (api.h's
    gemm_grouped_x8, on the variants that have it): a row's logits do not depend on which rows come with it, and
    stay near the 16-bit step's; fewer rows, and every single sequence's step, stay 16-bit, bit for bit."""
    model, _ = model_at(arch, "w4a16-w5w6")
    prompts = [p[:6] for p in PROMPTS[1:]] + [[2, 5, 7, 11, 13, 17], [2, 8, 9, 10, 11, 12]]
    sixteen = _batched_logits(model, prompts)
    cpp_step.set_batch_activations(model, "int8")
    try:
        eight = _batched_logits(model, prompts)
        others = _batched_logits(model, prompts[:1] + prompts[-(cpp_step.X8_ROWS - 1) :])
        few = _batched_logits(model, prompts[: cpp_step.X8_ROWS - 1])
    finally:
        cpp_step.set_batch_activations(model, "int16")
    assert torch.equal(others[0], eight[0])  # the same row among other companions
    assert torch.equal(few, sixteen[: cpp_step.X8_ROWS - 1])  # below X8_ROWS: the 16-bit kernels
    if not torch.ops.quantspec.has_gemm_grouped_x8(kernels.format_number("w4a16")):
        assert torch.equal(eight, sixteen)  # no int8 GEMM on this variant: the step stays 16-bit
        return
    assert not torch.equal(eight, sixteen)
    err = ((eight - sixteen).abs().amax(-1) / sixteen.abs().amax(-1)).max()
    assert err < 0.05, err  # x rounded to int8 per 128 values where the 16-bit step keeps 15 bits
