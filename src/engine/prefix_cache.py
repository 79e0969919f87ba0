"""Keys and values of finished sequences kept for the next request that starts the same way (a prefix cache, as
llama-server's `cache_prompt` and vLLM's automatic prefix caching): a shared system prompt, a chat's history, or
a prompt sent again is not prefilled again.

When a sequence ends, its cache (prompt and answer, every position but the last token's, which was never fed) is
kept whole under its tokens, as it is: nothing is copied then. A new sequence takes the entry that shares the
longest run of its first tokens, and a copy of that many positions (StepCache.prefix) becomes its own cache; it is
fed only the rest of its prompt, at least its last token (whose row gives the first new token). A position's
keys and values depend only on the tokens up to it (each row of a batched step is computed as it would be alone),
so a sequence started from a kept prefix decodes the tokens it would have from nothing, bit for bit
(tests/engine/test_prefix_cache.py).

What it holds is bounded by `max_bytes`: the least recently used entries leave first, and an entry whose tokens
begin a newer one's is dropped for it (the newer holds all it held).
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass


@dataclass
class Stats:
    """What the cache saved: prompt tokens asked for, those taken from it, lookups and those that hit."""

    prompt_tokens: int = 0
    hit_tokens: int = 0
    hits: int = 0
    lookups: int = 0

    def hit_fraction(self) -> float:
        return self.hit_tokens / self.prompt_tokens if self.prompt_tokens else 0.0


class PrefixCache:
    def __init__(self, max_bytes: int):
        self.max_bytes = max_bytes
        self.entries: OrderedDict[tuple[int, ...], object] = OrderedDict()  # tokens -> StepCache, oldest first
        self.held = 0
        self.stats = Stats()

    def __len__(self) -> int:
        return len(self.entries)

    def keep(self, tokens: list[int], cache) -> None:
        """A finished sequence's cache, holding `tokens`' positions (cache.size() == len(tokens))."""
        size = cache.nbytes()
        if not tokens or size > self.max_bytes:
            return
        key = tuple(tokens)
        for other in [k for k in self.entries if len(k) <= len(key) and key[: len(k)] == k]:
            self._drop(other)  # it begins this one: this one answers every lookup it would
        self.entries[key] = cache
        self.held += size
        while self.held > self.max_bytes:
            self._drop(next(iter(self.entries)))

    def take(self, prompt: list[int], new_cache):
        """(a cache holding the longest kept run of `prompt`'s first tokens, at most all but its last; its
        length) for a new sequence: a copy of the entry's first positions, or `new_cache()` and 0 where none
        starts as the prompt does."""
        self.stats.lookups += 1
        self.stats.prompt_tokens += len(prompt)
        best, length = None, 0
        most = len(prompt) - 1  # the last prompt token is always fed: its row gives the first new token
        for key in self.entries:
            n = _common(key, prompt, most)
            if n > length:
                best, length = key, n
        if best is None:
            return new_cache(), 0
        self.entries.move_to_end(best)
        self.stats.hits += 1
        self.stats.hit_tokens += length
        return self.entries[best].prefix(length), length

    def _drop(self, key: tuple[int, ...]) -> None:
        self.held -= self.entries.pop(key).nbytes()


def _common(key: tuple[int, ...], prompt: list[int], most: int) -> int:
    """How many first tokens `key` and `prompt` share, at most `most`."""
    n = min(len(key), most)
    for i in range(n):
        if key[i] != prompt[i]:
            return i
    return n
