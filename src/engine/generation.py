"""What every engine shares: sampling settings, the result of one generation, and token choice."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, NamedTuple, Protocol, runtime_checkable

import numpy as np
import torch

from src.engine.config import Sampling  # the configured type itself: config imports no engine at load, so no cycle


@dataclass
class Generation:
    prompt_tokens: int
    new_token_ids: list[int]
    start: float  # perf_counter at the call
    token_times: list[float]  # perf_counter when each new token existed
    end: float  # perf_counter when the engine returned
    spec: Any = None  # speculative decoding's SpecStats, when a drafter ran

    @property
    def new_tokens(self) -> int:
        return len(self.new_token_ids)


class Request(NamedTuple):
    """One prompt's generation, as a task asks it of any engine (batch of 1). A tuple, so an engine unpacks it in
    one line."""

    input_ids: torch.Tensor  # [1, prompt tokens]
    max_new_tokens: int
    exact: bool  # no end-of-sequence before max_new_tokens (as min_new_tokens does), so benchmark runs compare
    sampling: Sampling
    pad_token_id: int | None
    stop: Callable[[list[int]], bool] | None = None  # given the new tokens so far, ends the generation when true


class Engine(Protocol):
    """What a task calls: quantspec's engines (src.engine.engine_for) and another runtime's (src.engine.runtimes,
    run in a process of its own by isolated.Isolated). `model` is the job's torch model; another runtime holds its
    own and is given None."""

    def __call__(self, model, request: Request) -> Generation: ...


@runtime_checkable
class ScoringEngine(Engine, Protocol):
    """An engine that gives logits for every position of a window (another runtime's, where it can): quality tasks
    score with them (src.quality.scoring) instead of torch's forward."""

    def window_score(self, ids, indices=None): ...


def eos_ids(model) -> set[int]:
    eos = getattr(model.generation_config, "eos_token_id", None)
    return set() if eos is None else {eos} if isinstance(eos, int) else set(eos)


def eos_ban(model, exact: bool):
    """logits -> logits with end-of-sequence made impossible when `exact` (as min_new_tokens does), else as is."""
    stop = eos_ids(model)
    if not (exact and stop):
        return lambda logits: logits
    banned = torch.tensor(sorted(stop), dtype=torch.long)
    return lambda logits: logits.index_fill(-1, banned.to(logits.device), float("-inf"))


def probabilities(logits: torch.Tensor, sampling: Sampling) -> torch.Tensor:
    """The distribution tokens are drawn from: temperature, then nucleus (top-p) filtering."""
    probs = torch.softmax(logits.float() / sampling.temperature, dim=-1)
    if sampling.top_p < 1.0:
        sorted_p, order = probs.sort(dim=-1, descending=True)
        # keep the smallest prefix whose mass reaches top_p (the token that crosses it included)
        drop = sorted_p.cumsum(dim=-1) - sorted_p >= sampling.top_p
        sorted_p = sorted_p.masked_fill(drop, 0.0)
        probs = torch.zeros_like(probs).scatter_(-1, order, sorted_p)
        probs = probs / probs.sum(dim=-1, keepdim=True)
    return probs


def draw(probs: torch.Tensor, generator: torch.Generator | None) -> int:
    """One index drawn from a distribution [V] (weights summing to > 0): the first whose running sum passes a
    uniform draw times the total. torch.multinomial took ~9 ms over Gemma 3's 262144 entries (as long as a
    4-bit decode step); this takes ~0.3 ms."""
    running = probs.double().cumsum(-1)
    u = torch.rand((), generator=generator, dtype=torch.float64) * running[-1]
    i = int(torch.searchsorted(running, u, right=True))
    i = min(i, probs.shape[-1] - 1)
    while probs[i] <= 0 and i > 0:  # a draw at an exact boundary never lands on a zero-weight entry
        i -= 1
    return i


def choose(logits: torch.Tensor, sampling: Sampling, generator: torch.Generator | None) -> int:
    """The next token from one row of logits: argmax when greedy, else a seeded draw."""
    if not sampling.do_sample:
        return int(logits.float().argmax(dim=-1))  # as generate does; and 3x faster than on bf16
    return draw(probabilities(logits, sampling), generator)


def token_loop(
    next_logits: Callable[[list[int]], np.ndarray],
    ids: list[int],
    max_new_tokens: int,
    exact: bool,
    eos: tuple[int, ...],
    sampling: Sampling,
    stop=None,
) -> Generation:
    """Decoding over another runtime that gives the logits after some tokens (`next_logits`: the prompt's
    ids first, then one token at a time, appended to what it holds): each token chosen as every engine
    chooses (greedy, or sampled with top-p), timestamped when it exists; end of sequence banned while
    `exact` (as min_new_tokens does), else it ends the generation, as does `stop(new_ids)`."""
    rng = np.random.default_rng(sampling.seed)
    new, times = [], []
    start = time.perf_counter()
    logits = next_logits(ids)
    while True:
        if exact and eos:
            logits = logits.copy()
            logits[list(eos)] = -np.inf
        token = int(np.argmax(logits)) if not sampling.do_sample else _sample(logits, sampling, rng)
        times.append(time.perf_counter())
        new.append(token)
        if len(new) >= max_new_tokens or (token in eos and not exact) or (stop is not None and stop(new)):
            break
        logits = next_logits([token])
    return Generation(len(ids), new, start, times, time.perf_counter())


def _sample(logits: np.ndarray, sampling: Sampling, rng) -> int:
    z = logits.astype(np.float64) / max(sampling.temperature, 1e-6)
    p = np.exp(z - z.max())
    p /= p.sum()
    order = np.argsort(-p)
    keep = order[: int(np.searchsorted(np.cumsum(p[order]), sampling.top_p) + 1)]
    return int(rng.choice(keep, p=p[keep] / p[keep].sum()))
