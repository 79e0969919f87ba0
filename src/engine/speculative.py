"""Speculative decoding: a drafter proposes k tokens, the target checks them all in one forward.

Greedy: the target keeps every proposed token up to its first disagreement, then adds its own next
token, so each step yields 1..k+1 tokens and the output is exactly the target's greedy output.
Sampling: the rule of Leviathan et al. / Chen et al. (`accept_or_resample`): a proposal x drawn from
the draft's q is kept with probability min(1, p(x)/q(x)); at the first rejection a token is drawn from
norm(max(0, p - q)); if all k are kept a (k+1)-th is drawn from p. The output is distributed exactly
as the target's own sampling (tested with a chi-square test).

Drafters: `PromptLookup` (n-grams of the context itself, no model; its q is a point mass) and
`ModelDrafter` (a smaller model, or the target at a lower precision, over its own KV cache).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from src.engine.generation import Generation, Request, draw, eos_ban, eos_ids, probabilities
from src.engine.native import decoder

# A draft proposal: (tokens, the draft's distribution for each or None when it is a point mass)
Proposal = tuple[list[int], list[torch.Tensor | None]]


class PromptLookup:
    """Propose the tokens that followed the latest earlier occurrence of the context's last n-gram."""

    def __init__(self, max_ngram: int = 3, min_ngram: int = 1):
        self.max_ngram, self.min_ngram = max_ngram, min_ngram

    def start(self) -> None:
        """Nothing to reset: it reads the context afresh."""

    def propose(self, context: list[int], k: int, sample: Callable) -> Proposal:
        for n in range(self.max_ngram, self.min_ngram - 1, -1):
            if len(context) <= n:
                continue
            tail = context[-n:]
            for start in range(len(context) - n - 1, -1, -1):
                if context[start : start + n] == tail:
                    tokens = context[start + n : start + n + k]
                    return tokens, [None] * len(tokens)
        return [], []

    def accepted(self, context: list[int]) -> None:
        """Nothing to keep in step."""


class ModelDrafter:
    """A draft model decoding over its own cache, kept in step with the accepted context."""

    def __init__(self, model, path: str = "transformers", compile: bool = False):
        self.model, self.path, self.compile = model, path, compile  # engine.step_path, engine.compile
        self.start()

    def start(self) -> None:
        self.decoder = decoder(self.model, self.path, compile=self.compile)
        self.fed = 0  # context tokens in the draft cache

    def _catch_up(self, context: list[int]) -> torch.Tensor:
        """Feed what the cache lacks; returns logits after the last context token."""
        missing = context[self.fed :]
        self.fed = len(context)
        if self.decoder.length == 0:
            head = self.model.get_output_embeddings()
            if hasattr(head, "focus"):  # a cut-down head (draft.vocab) keeps the prompt's tokens too
                head.focus(context)
            return self.decoder.prefill(torch.tensor([missing], device=self.model.device))
        return self.decoder.verify(missing)[-1]

    def propose(self, context: list[int], k: int, sample: Callable) -> Proposal:
        """`sample(logits) -> (token, q or None)`: the draft picks as the target would (greedy or sampled)."""
        if k <= 0:
            return [], []
        logits = self._catch_up(context)
        tokens, dists = [], []
        for i in range(k):
            token, q = sample(logits)
            tokens.append(token)
            dists.append(q)
            if i + 1 < k:
                logits = self.decoder.step(token)
        # the last proposal was never fed; the others were, and count as fed until rolled back
        self.fed += len(tokens) - 1
        return tokens, dists

    def accepted(self, context: list[int]) -> None:
        """Drop the cached draft positions past the accepted context."""
        extra = self.fed - len(context)
        if extra > 0:
            self.decoder.rollback(extra)
            self.fed = len(context)


# The draft kinds (draft.kind) and the drafter each runs, as ENGINES and TASKS register theirs: a kind is
# chosen here and built by src.assembly.job's DRAFT_BUILDS, which has one builder for each.
DRAFTERS: dict[str, type] = {"prompt_lookup": PromptLookup, "model": ModelDrafter}


class Schedule:
    """Draft length per step. constant: always k. heuristic (transformers' assisted generation rule):
    +2 after a step that kept every proposal, -1 after one that did not, within [1, k_max]."""

    def __init__(self, k: int, kind: str = "constant", k_max: int = 8):
        self.k, self.kind, self.k_max = k, kind, k_max

    def update(self, proposed: int, kept: int) -> None:
        if self.kind == "heuristic" and proposed:
            self.k = min(self.k + 2, self.k_max) if kept == proposed else max(self.k - 1, 1)


@dataclass
class SpecStats:
    steps: int = 0
    proposed: int = 0
    accepted: int = 0
    draft_s: float = 0.0
    verify_s: float = 0.0
    per_step: list[int] = field(default_factory=list)  # accepted proposals per step

    @property
    def acceptance_rate(self) -> float:
        return self.accepted / self.proposed if self.proposed else float("nan")

    @property
    def mean_accepted(self) -> float:
        return self.accepted / self.steps if self.steps else float("nan")

    @property
    def mean_k(self) -> float:
        return self.proposed / self.steps if self.steps else float("nan")

    def step(self, proposed: int, accepted: int, draft_s: float, verify_s: float) -> None:
        """One draft-and-verify step's counts and times."""
        self.steps += 1
        self.proposed += proposed
        self.accepted += accepted
        self.per_step.append(accepted)
        self.draft_s += draft_s
        self.verify_s += verify_s


def accept_or_resample(
    p: torch.Tensor, draft: list[int], q: list[torch.Tensor | None], generator: torch.Generator | None
) -> tuple[int, int]:
    """The sampling rule. p: [len(draft) + 1, V] target probabilities after each position; q[i] the
    draft's distribution for draft[i] (None: a point mass). Returns (proposals kept, the next token)."""
    for i, x in enumerate(draft):
        p_x = float(p[i, x])
        q_x = 1.0 if q[i] is None else float(q[i][x])
        if q_x <= p_x or float(torch.rand((), generator=generator)) < p_x / q_x:
            continue
        residual = p[i].clone()
        if q[i] is None:
            residual[x] = 0.0
        else:
            residual = (residual - q[i]).clamp_(min=0.0)
        if float(residual.sum()) <= 0:  # only when p == q up to rounding: any draw from p is right
            residual = p[i]
        return i, draw(residual, generator)
    return len(draft), draw(p[len(draft)], generator)


def accept_greedy(logits: torch.Tensor, draft: list[int]) -> tuple[int, int]:
    """Greedy verification: how many draft tokens the target's own picks agree with, and its next token."""
    choices = logits.float().argmax(dim=-1).tolist()
    kept = 0
    while kept < len(draft) and draft[kept] == choices[kept]:
        kept += 1
    return kept, choices[kept]


def _cut(new: list[int], tokens: list[int], eos, stop) -> list[int]:
    """The step's tokens up to an end-of-sequence or a stop sequence, where plain decoding would end."""
    for i, t in enumerate(new):
        if t in eos or (stop and i < len(new) - 1 and stop(tokens + new[: i + 1])):
            return new[: i + 1]
    return new


@torch.inference_mode()
def generate(
    model,
    request: Request,
    *,
    drafter,
    k: int,
    schedule: str = "constant",
    k_max: int = 8,
    path: str = "transformers",
    compile: bool = False,
) -> Generation:
    """One prompt with a drafter; the same call shape as the other engines. Greedy output equals the
    target's greedy output; sampled output follows the target's distribution. Stats in `.spec`."""
    input_ids, max_new_tokens, exact, sampling, pad_token_id, stop = request
    eos, ban = eos_ids(model), eos_ban(model, exact)
    generator = torch.Generator().manual_seed(sampling.seed) if sampling.do_sample else None

    def sample(logits: torch.Tensor) -> tuple[int, torch.Tensor | None]:
        """A drafter's pick: greedy, or a draw from its own distribution (returned for the rule)."""
        if not sampling.do_sample:
            return int(ban(logits).float().argmax()), None
        q = probabilities(ban(logits), sampling)
        return draw(q, generator), q

    def first(logits: torch.Tensor) -> int:
        return sample(logits)[0]

    stats, plan = SpecStats(), Schedule(k, schedule, k_max)
    target = decoder(model, path, reserve=max_new_tokens + k_max + 1, compile=compile)
    drafter.start()
    prompt = input_ids[0].tolist()
    start = time.perf_counter()
    token = first(target.prefill(input_ids.to(model.device)))
    tokens, times = [token], [time.perf_counter()]
    while len(tokens) < max_new_tokens and token not in eos and not (stop and stop(tokens)):
        t0 = time.perf_counter()
        room = min(plan.k, max_new_tokens - len(tokens) - 1)
        draft, dists = drafter.propose(prompt + tokens, room, sample) if room > 0 else ([], [])
        t1 = time.perf_counter()
        logits = ban(target.verify([token] + draft))  # row i: the target's view after position i
        if sampling.do_sample:
            kept, nxt = accept_or_resample(probabilities(logits, sampling), draft, dists, generator)
        else:
            kept, nxt = accept_greedy(logits, draft)
        target.rollback(len(draft) - kept)
        new = _cut(draft[:kept] + [nxt], tokens, eos if not exact else (), stop)
        now = time.perf_counter()
        tokens += new
        times += [now] * len(new)
        token = tokens[-1]
        drafter.accepted(prompt + tokens[:-1])
        plan.update(len(draft), kept)
        stats.step(len(draft), kept, t1 - t0, now - t1)
    tokens, times = tokens[:max_new_tokens], times[:max_new_tokens]
    return Generation(input_ids.shape[1], tokens, start, times, time.perf_counter(), spec=stats)
