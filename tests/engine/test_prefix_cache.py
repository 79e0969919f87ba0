"""The prefix cache (src.engine.prefix_cache) under continuous batching: a sequence that starts from a kept prefix
(a repeated prompt, a shared system prompt, a chat's next turn) is fed only the rest of its prompt and decodes
the tokens it gets from nothing, bit for bit, on every family and precision; what the cache holds stays within
its bytes, the least recently used leaving first."""

import pytest

from src.engine import batching
from src.engine.prefix_cache import PrefixCache
from tests.engine.test_batching import alone
from tests.engine.tiny import model_at

SYSTEM = list(range(2, 30))  # a shared start: 28 tokens
PROMPTS = [SYSTEM + [40, 41, 42], SYSTEM + [50, 51], SYSTEM + [40, 41, 42], SYSTEM[:10]]
NEW = 6


def served(model, prompts, prefixes, max_batch_tokens=8):
    """Each prompt through one Scheduler in turn (each after the one before ends): its tokens, and the rows fed."""
    scheduler = batching.Scheduler(batching.BatchStep(model), max_batch_tokens=max_batch_tokens, prefixes=prefixes)
    out, rows = [], []
    for prompt in prompts:
        got = []
        scheduler.add(batching.Sequence(prompt, NEW, lambda t, d, got=got: got.append(t)))
        fed = 0
        while not scheduler.idle:
            fed += scheduler.step()
        out.append(got)
        rows.append(fed)
    return out, rows


@pytest.mark.parametrize("precision", ["fp32", "bf16", "w4a16", "w8a8"])
@pytest.mark.parametrize("arch", ["gemma3", "llama", "qwen2"])
def test_a_sequence_from_a_kept_prefix_decodes_what_it_decodes_from_nothing(arch, precision):
    model, _ = model_at(arch, precision)
    prefixes = PrefixCache(64 << 20)
    got, rows = served(model, PROMPTS, prefixes)
    for prompt, tokens in zip(PROMPTS, got, strict=True):
        assert tokens == alone(model, prompt, NEW), f"prompt of {len(prompt)} tokens"
    # the first fed whole; the second from the system prompt on; the third, a repeat, from its last token; the
    # fourth, the system prompt's start, from its last token too
    assert rows == [len(PROMPTS[0]) + NEW - 1, 2 + NEW - 1, 1 + NEW - 1, 1 + NEW - 1]
    stats = prefixes.stats
    assert stats.hits == 3 and stats.hit_tokens == len(SYSTEM) + len(PROMPTS[2]) - 1 + len(PROMPTS[3]) - 1


def test_a_chats_next_turn_starts_from_the_answer_before_it():
    model, _ = model_at("gemma3", "w4a16")
    prefixes = PrefixCache(64 << 20)
    (first,), _ = served(model, [SYSTEM], prefixes)
    turn = SYSTEM + first + [60, 61]  # the history, its answer, the next question
    (second,), (fed,) = served(model, [turn], prefixes)
    # kept: the history and its answer but the answer's last token (never fed): that and the question are fed
    assert second == alone(model, turn, NEW) and fed == 3 + NEW - 1


def test_what_it_holds_stays_within_its_bytes_the_oldest_leaving_first():
    model, _ = model_at("llama", "fp32")
    probe = PrefixCache(1 << 30)
    served(model, [list(range(2, 12))], probe)
    one = probe.held  # one finished sequence's cache, as held
    prefixes = PrefixCache(int(2.5 * one))
    served(model, [list(range(2, 12)), list(range(20, 30)), list(range(40, 50))], prefixes)
    assert len(prefixes) == 2 and prefixes.held <= prefixes.max_bytes
    assert [k[0] for k in prefixes.entries] == [20, 40]  # the first, least recently used, left
    served(model, [list(range(20, 30)) + [70]], prefixes)  # a hit: 20's entry is the most recently used now
    assert [k[0] for k in prefixes.entries] == [20, 20] and len(prefixes) == 2


class Held:
    """A cache of n positions, as the prefix cache sees one: its bytes."""

    def __init__(self, n):
        self.n = n

    def nbytes(self):
        return 100 * self.n


def test_an_entry_that_begins_a_newer_one_is_dropped_for_it():
    prefixes = PrefixCache(10_000)
    prefixes.keep([1, 2, 3], Held(3))
    prefixes.keep([5, 6], Held(2))
    prefixes.keep([1, 2, 3, 4], Held(4))  # holds all [1, 2, 3] held
    assert list(prefixes.entries) == [(5, 6), (1, 2, 3, 4)] and prefixes.held == 600
    prefixes.keep(list(range(200)), Held(200))  # more than it may hold at all: not kept, nothing dropped for it
    assert len(prefixes) == 2 and prefixes.held == 600


def test_off_feeds_every_prompt_whole():
    model, _ = model_at("llama", "fp32")
    _, rows = served(model, [PROMPTS[0], PROMPTS[0]], None)
    assert rows == [len(PROMPTS[0]) + NEW - 1] * 2
