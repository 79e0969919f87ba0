"""Speculative decoding, greedy: a drafter proposes k tokens, the target verifies them in one forward.

The target keeps every proposed token up to its first disagreement, then adds its own next token, so
each verify step yields 1..k+1 tokens and the output is exactly the target's greedy output. (The
sampling accept/reject rule and the config wiring are issue 5's next steps.)

Drafters: `PromptLookup` (n-grams of the context itself, no model) and `ModelDrafter` (a smaller model,
or the target at a lower precision, greedy over its own KV cache).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import torch

from src.engine.common import Generation, eos_ban, eos_ids
from src.engine.native import Decoder


class PromptLookup:
    """Propose the tokens that followed the latest earlier occurrence of the context's last n-gram."""

    def __init__(self, max_ngram: int = 3, min_ngram: int = 1):
        self.max_ngram, self.min_ngram = max_ngram, min_ngram

    def propose(self, context: list[int], k: int) -> list[int]:
        for n in range(self.max_ngram, self.min_ngram - 1, -1):
            if len(context) <= n:
                continue
            tail = context[-n:]
            for start in range(len(context) - n - 1, -1, -1):
                if context[start:start + n] == tail:
                    return context[start + n:start + n + k]
        return []

    def accepted(self, context: list[int]) -> None:
        """Nothing to keep in step: it reads the context afresh."""


class ModelDrafter:
    """A draft model decoding greedily over its own cache, kept in step with the accepted context."""

    def __init__(self, model):
        self.decoder = Decoder(model)
        self.fed = 0  # context tokens in the draft cache

    def _catch_up(self, context: list[int]) -> torch.Tensor:
        """Feed what the cache lacks; returns logits after the last context token."""
        missing = context[self.fed:]
        self.fed = len(context)
        if self.decoder.length == 0:
            return self.decoder.prefill(torch.tensor([missing], device=self.decoder.model.device))
        return self.decoder.verify(missing)[-1]

    def propose(self, context: list[int], k: int) -> list[int]:
        if k <= 0:
            return []
        logits = self._catch_up(context)
        draft = []
        for i in range(k):
            draft.append(int(logits.argmax()))
            if i + 1 < k:
                logits = self.decoder.step(draft[-1])
        # the last proposal was never fed; the others were, and count as fed until rolled back
        self.fed += len(draft) - 1
        return draft

    def accepted(self, context: list[int]) -> None:
        """Drop the cached draft positions past the accepted context."""
        extra = self.fed - len(context)
        if extra > 0:
            self.decoder.rollback(extra)
            self.fed = len(context)


@dataclass
class SpecStats:
    steps: int = 0
    proposed: int = 0
    accepted: int = 0
    draft_s: float = 0.0
    verify_s: float = 0.0
    per_step: list[int] = field(default_factory=list)

    @property
    def acceptance_rate(self) -> float:
        return self.accepted / self.proposed if self.proposed else 0.0


@torch.inference_mode()
def generate(model, drafter, input_ids: torch.Tensor, max_new_tokens: int, exact: bool, k: int
             ) -> tuple[Generation, SpecStats]:
    """Greedy speculative decoding of one prompt; output identical to greedy decoding of `model`."""
    stop, ban = eos_ids(model), eos_ban(model, exact)

    def pick(logits: torch.Tensor) -> torch.Tensor:
        return ban(logits).argmax(dim=-1)

    stats = SpecStats()
    target = Decoder(model)
    prompt = input_ids[0].tolist()
    start = time.perf_counter()
    token = int(pick(target.prefill(input_ids.to(model.device))))
    tokens, times = [token], [time.perf_counter()]
    while len(tokens) < max_new_tokens and token not in stop:
        t0 = time.perf_counter()
        draft = drafter.propose(prompt + tokens, min(k, max_new_tokens - len(tokens) - 1)) if k else []
        t1 = time.perf_counter()
        choices = pick(target.verify([token] + draft)).tolist()  # choices[i]: the target's token after position i
        n = 0
        while n < len(draft) and draft[n] == choices[n]:
            n += 1
        new = draft[:n] + [choices[n]]
        target.rollback(len(draft) - n)
        if not exact:  # end-of-sequence ends the generation where greedy decoding would
            for i, t in enumerate(new):
                if t in stop:
                    new = new[:i + 1]
                    break
        now = time.perf_counter()
        tokens += new
        times += [now] * len(new)
        token = tokens[-1]
        drafter.accepted(prompt + tokens[:-1])
        stats.steps += 1
        stats.proposed += len(draft)
        stats.accepted += n
        stats.per_step.append(len(new))
        stats.draft_s += t1 - t0
        stats.verify_s += now - t1
    tokens, times = tokens[:max_new_tokens], times[:max_new_tokens]
    return Generation(input_ids.shape[1], tokens, start, times, time.perf_counter()), stats
