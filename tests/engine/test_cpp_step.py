"""The C++ step (src.engine.cpp_step, src/kernels/step.cpp) against the Python step path it replaces: the same
logits bit for bit, per family and precision, through steps, verifications, rollbacks and sliding windows,
on every kernel variant this host runs (test_kernels.py checks each variant's kernels against the reference).
"""

import pytest
import torch

from src import kernels
from src.engine import GENERATE, Sampling, cpp_step, engine_for, speculative
from src.engine.generation import Request
from src.engine.native import Decoder
from src.engine.subset_head import cut_head, frequent_tokens
from src.kernels import modules, variants
from src.models import families
from src.models.tiny import tiny_model
from tests.engine.tiny import PRECISIONS, model_at
from tests.support.kernels import KERNELS as CACHE
from tests.support.kernels import use_variant as use

FAMILIES = [f.name for f in families.FAMILIES.values() if f.cpp_step]  # the families step.cpp runs


@pytest.fixture(autouse=True, params=[v.name for v in variants.for_arch()])
def isa(request):
    """Every kernel variant this CPU runs (the step calls the variant's table: AVX2's too on an AVX-512
    host); one it lacks is skipped, saying which instructions."""
    return use(request.param)


@pytest.fixture(scope="module", autouse=True)
def best_variant_after():
    yield
    kernels.load(CACHE)  # the tests after these run on the variant a job would pick


def python_path(model) -> Decoder:
    return Decoder(model, "python")


def run(decoder: Decoder, prompt: torch.Tensor, moves) -> list[torch.Tensor]:
    out = [decoder.prefill(prompt)]
    for kind, arg in moves:
        if kind == "step":
            out.append(decoder.step(arg))
        elif kind == "verify":
            out.append(decoder.verify(arg))
        else:
            decoder.rollback(arg)
            out.append(torch.tensor(decoder.length))
    return out


@pytest.mark.parametrize("precision", PRECISIONS)
@pytest.mark.parametrize("arch", FAMILIES)
def test_the_cpp_step_gives_the_python_steps_logits_bit_for_bit(arch, precision):
    model, tok = model_at(arch, precision)
    assert cpp_step.for_model(model) is not None, "the C++ step should cover this model"
    ids = tok("def f(x):", return_tensors="pt").input_ids
    moves = [("step", 70), ("step", 71), ("verify", [72, 73, 74, 75]), ("rollback", 2), ("step", 76)]
    moves += [("step", 80 + i) for i in range(6)]
    with torch.inference_mode():
        own = Decoder(model, "cpp")
        assert own.compiled is not None
        ours, theirs = run(own, ids, moves), run(python_path(model), ids, moves)
    for a, b in zip(ours, theirs, strict=True):
        assert a.dtype == b.dtype and torch.equal(a, b)


@pytest.mark.parametrize("precision", PRECISIONS)
def test_the_steps_logits_do_not_depend_on_how_many_threads_compute_them(precision):
    """The step picks its thread count per call (step.cpp's Threads): every count must give the same logits
    and the same greedy token, bit for bit, or adapting to a busy host would change what is decoded."""
    model, tok = model_at("gemma3", precision)
    ids = tok("def f(x):", return_tensors="pt").input_ids
    moves = [("step", 70), ("verify", [72, 73, 74]), ("rollback", 1), *[("step", 80 + i) for i in range(4)]]
    stepper = cpp_step.for_model(model).stepper
    previous = torch.get_num_threads()
    outs = []
    try:
        stepper.adapt_threads(False)
        for threads in (1, 2, 3):
            torch.set_num_threads(threads)
            with torch.inference_mode():
                outs.append(run(Decoder(model, "cpp"), ids, moves))
    finally:
        torch.set_num_threads(previous)
        stepper.adapt_threads(True)
    for other in outs[1:]:
        for a, b in zip(outs[0], other, strict=True):
            assert torch.equal(a, b)
    assert {1, 2, 3} <= set(cpp_step.thread_counts(model))  # each count ran, and was counted


@pytest.mark.parametrize("precision", ["fp32", "w4a16"])
def test_the_cpp_step_keeps_greedy_output_past_the_sliding_window_and_after_a_long_prompt(precision):
    """gemma3's tiny window is 32 keys: the Python path hands such a context back to transformers; the C++
    step keeps it, masking by the window itself, and must still decode what transformers decodes. A prompt
    longer than a step goes through transformers' forward and its cache is handed over."""
    model, tok = model_at("gemma3", precision)
    for prompt in ("y" * 12, "x" * 40):
        ids = tok(prompt, return_tensors="pt").input_ids
        ref = GENERATE["hf"](model, Request(ids, 40, True, Sampling(), tok.pad_token_id))
        own = engine_for("native", "cpp")(model, Request(ids, 40, True, Sampling(), tok.pad_token_id))
        assert own.new_token_ids == ref.new_token_ids


def test_models_it_does_not_cover_keep_the_python_path():
    plain, _ = tiny_model("gemma3")  # no kernels installed: ATen's linears
    assert cpp_step.for_model(plain) is None
    opt, _ = model_at("opt", "fp32")  # layer norms and learned positions: the Python step path's
    assert cpp_step.for_model(opt) is None and Decoder(opt, "cpp").fast is not None


def test_a_draft_and_its_target_on_the_cpp_step_decode_the_targets_greedy_output():
    """Assisted generation with both models on the C++ step: verification of k drafted tokens and the
    rollback of the rejected ones go through it, and the output is the target's own greedy output."""
    target, tok = model_at("llama", "bf16")
    draft, _ = model_at("llama", "w4a16")
    assert cpp_step.for_model(target) is not None and cpp_step.for_model(draft) is not None
    ids = tok("def add(a, b):\n    return a + b\n\ndef add(a, b):", return_tensors="pt").input_ids
    plain = GENERATE["native"](target, Request(ids, 30, True, Sampling(), tok.pad_token_id), path="cpp")
    drafter = speculative.ModelDrafter(draft, path="cpp")
    assisted = speculative.generate(
        target, Request(ids, 30, True, Sampling(), tok.pad_token_id), drafter=drafter, k=4, path="cpp"
    )
    assert assisted.new_token_ids == plain.new_token_ids
    assert assisted.spec.proposed > 0 and 0 < assisted.spec.accepted <= assisted.spec.proposed
    # a draft whose head is cut down to frequent tokens (draft.vocab): its layers still run in C++, the cut
    # head in Python (draft=self_w8a8_vocab4k had failed on it)
    cut_head(draft, frequent_tokens(tok, "def add(a, b):\n    return a + b\n" * 8, 12))
    cut = speculative.generate(
        target, Request(ids, 30, True, Sampling(), tok.pad_token_id), drafter=drafter, k=4, path="cpp"
    )
    assert cut.new_token_ids == plain.new_token_ids and cpp_step.for_model(draft)._fused_head() is False


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_equal_logits_in_both_threads_columns_give_the_first_index(precision):
    """Every row of the head alike: the logits tie (all but the last few columns, which a kernel sums in
    another order), so each thread's choice is the first column it computed, and only the merge of the
    threads' choices decides. It must give torch.argmax's first index among the largest (banned ids left
    out), not the other thread's."""
    model, tok = tiny_model("gemma3")
    with torch.no_grad():
        model.lm_head.weight.copy_(model.lm_head.weight[5].expand_as(model.lm_head.weight))
    model = model.to(torch.bfloat16 if precision == "bf16" else torch.float32)
    modules.install(model)
    ids = tok("def f(x):", return_tensors="pt").input_ids
    with torch.inference_mode():
        decoder = Decoder(model, "cpp")
        decoder.prefill(ids)
        logits = decoder.step(70).float().flatten()
        decoder.rollback(1)
        body = logits[: logits.numel() // 4 * 4]  # the columns summed in blocks of 4: bit-for-bit alike
        assert int((body == body.max()).sum()) == body.numel()  # ties across every piece
        for banned in ([], [0], [0, 1, 2]):
            banned = torch.tensor(banned, dtype=torch.long)
            expected = int(logits.index_fill(-1, banned, float("-inf")).argmax())
            assert decoder.greedy_step(70, banned) == expected
            decoder.rollback(1)


def prefilled_pair(model, tok) -> tuple[Decoder, Decoder]:
    """Two C++-step decoders prefilled alike: one to choose greedily, one to show its logits."""
    ids = tok("def f(x):", return_tensors="pt").input_ids
    pair = Decoder(model, "cpp"), Decoder(model, "cpp")
    for decoder in pair:
        decoder.prefill(ids)
    return pair


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_a_head_of_many_pieces_gives_torchs_argmax_and_its_first_nan(precision):
    """A head wide enough that each thread computes it in many pieces (~256 KB of weights each): the step
    skips a piece whose largest value cannot beat the choice so far, so the choice must still be
    torch.argmax's with banned ids left out, and a NaN in a late piece must still be taken (torch.argmax
    returns the first NaN; banned, the next)."""
    model, tok = tiny_model("gemma3")
    vocab = 40_000  # fp32 rows of 128 values: 512 a piece, ~40 pieces per thread
    generator = torch.Generator().manual_seed(3)
    head = torch.nn.Linear(model.config.hidden_size, vocab, bias=False)
    with torch.no_grad():
        head.weight.copy_(torch.randn(vocab, model.config.hidden_size, generator=generator))
    model.lm_head = head
    model = model.to(torch.bfloat16 if precision == "bf16" else torch.float32)
    modules.install(model)
    with torch.inference_mode():
        fused, plain = prefilled_pair(model, tok)
        token = 70
        for i in range(6):
            if i == 4:  # rows 31000 and 35000 NaN: their logits are NaN, the first of them the choice
                with torch.no_grad():
                    model.lm_head.weight[[31_000, 35_000]] = float("nan")
            logits = plain.step(token).float()
            top = int(logits.argmax())
            banned = torch.tensor([top, 7] if i % 2 else [], dtype=torch.long)
            expected = int(logits.index_fill(-1, banned, float("-inf")).argmax())
            assert fused.greedy_step(token, banned) == expected
            if i >= 4:  # the first NaN, or with it banned the next
                assert expected == (31_000 if i == 4 else 35_000)
            token = expected % 259  # a token of the tiny vocabulary


@pytest.mark.parametrize("precision", ["fp32", "bf16", "w4a16"])
def test_the_greedy_token_chosen_inside_the_cpp_step_is_torchs_argmax(precision):
    """The fused head's argmax (the logits never leave C++) against torch.argmax over the logits of the
    same step, with banned ids left out as eos_ban's -inf does; bf16 logits tie often, and torch takes the
    first index."""
    model, tok = model_at("gemma3", precision)
    with torch.inference_mode():
        fused, plain = prefilled_pair(model, tok)
        token = 70
        for i in range(12):
            logits = plain.step(token)
            banned = torch.tensor([int(logits.float().argmax())] if i % 3 == 2 else [], dtype=torch.long)
            expected = int(logits.index_fill(-1, banned, float("-inf")).float().argmax())
            assert fused.greedy_step(token, banned) == expected
            assert fused.length == plain.length
            token = expected
