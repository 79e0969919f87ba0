"""Continuous batching on the C++ step: many sequences decode together, one token each a step, while new
arrivals' prompts are fed in chunks between them (src.serve's engine).

Each step is one call of step.cpp's `batch_*` (src.engine.cpp_step's Stepper): every projection one kernel call
over all the step's rows, attention per row over its own sequence's cache. A row's values do not depend on
which rows come with it (the kernels compute each row alike, attention is per row), so each sequence's
greedy tokens are those it would get decoded alone on the C++ step, bit for bit
(tests/engine/test_batching.py, every precision and family).

What a step holds (`Scheduler.plan`): every sequence that is decoding, one row each (at most
`max_sequences` of them), then the oldest arrivals' prompt chunks up to `max_batch_tokens` rows in all (a
decode step's weights are read once for all of them: a prompt chunk rides along at little cost to the decoding
sequences; at least one prompt row whatever the budget, so a prompt always advances). A prompt's last chunk
emits its first token in the same step.

With a prefix cache (src.engine.prefix_cache), a sequence that ends leaves its cache there, and a new one starts
from the longest run of its prompt's first tokens kept, fed only the rest.

Only models the C++ step covers batch (Gemma 3 and Llama/Qwen2 on quantspec's kernels: engine=native);
`for_model` says why not in one line otherwise.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from src.common.say import message_line
from src.engine import cpp_step
from src.engine.config import Sampling
from src.engine.generation import draw, eos_ids, probabilities
from src.engine.prefix_cache import PrefixCache

MAX_SEQUENCES = 16  # the kernels' blocking was tuned for up to 16 rows (draft verification)


class Unbatchable(Exception):
    """The model cannot run batched (the message says why and what to use)."""


@dataclass(eq=False)
class Sequence:
    """One request's sequence: its prompt, what it has generated, and its place in the cache.

    `emit(token, done)` is called from the scheduler's thread with each new token (done: a reason, or None
    while it goes on); `stop(tokens)` may end it early (a stop string)."""

    prompt: list[int]
    max_new_tokens: int
    emit: Callable[[int | None, str | None], None]
    sampling: Sampling = field(default_factory=Sampling)
    ignore_eos: bool = False
    stop: Callable[[list[int]], bool] | None = None
    tokens: list[int] = field(default_factory=list)
    fed: int = 0  # prompt tokens in the cache so far
    cache: object = None
    cancelled: bool = False
    arrived: float = field(default_factory=time.perf_counter)
    generator: torch.Generator | None = None

    @property
    def prefilling(self) -> bool:
        return self.fed < len(self.prompt)

    def next_input(self) -> int:
        return self.tokens[-1]


class BatchStep:
    """One batched call of the model's C++ step: a list of (sequence, tokens to feed, whether it emits) in,
    each emitting sequence's next token out."""

    def __init__(self, model):
        self.model = model
        self.compiled = for_model(model)
        self.eos = eos_ids(model)
        self.banned = torch.tensor(sorted(self.eos), dtype=torch.long)

    def new_cache(self):
        return self.compiled.new_cache()

    @torch.inference_mode()
    def __call__(self, rows: list[tuple[Sequence, list[int], bool]]) -> list[int]:
        """Feed each sequence its tokens; the next token of each that emits, in order."""
        compiled = self.compiled
        ids = torch.tensor([t for _, tokens, _ in rows for t in tokens], dtype=torch.long)
        caches = [seq.cache for seq, _, _ in rows]
        counts = [len(tokens) for _, tokens, _ in rows]
        emit = [int(e) for _, _, e in rows]
        compiled._tables(max(seq.cache.size() + len(tokens) for seq, tokens, _ in rows))
        emitting = [seq for seq, _, e in rows if e]
        if not emitting:  # prompt chunks only: the layers, no head
            compiled.stepper.batch_hidden(ids, caches, counts, emit)
            return []
        sampled = any(seq.sampling.do_sample for seq in emitting)
        if compiled._fused_head() and not sampled:  # the argmax taken where the head's columns are computed
            ban = [int(seq.ignore_eos) for seq, _, _ in rows]
            return compiled.stepper.batch_greedy(ids, caches, counts, emit, self.banned, ban).tolist()
        if compiled._fused_head():
            logits = compiled.stepper.batch_logits(ids, caches, counts, emit)
        else:  # a head the stepper does not run (soft-capped): the model's own, after the final norm
            logits = self.model.lm_head.forward(compiled.stepper.batch_hidden(ids, caches, counts, emit)[None])[0]
            if compiled.softcap is not None:
                logits = torch.tanh(logits / compiled.softcap) * compiled.softcap
        return [self._choose(seq, row) for seq, row in zip(emitting, logits, strict=True)]

    def _choose(self, seq: Sequence, logits: torch.Tensor) -> int:
        if seq.ignore_eos and self.eos:
            logits = logits.clone()
            logits[sorted(self.eos)] = float("-inf")
        if not seq.sampling.do_sample:
            return int(logits.float().argmax(dim=-1))
        if seq.generator is None:
            seq.generator = torch.Generator().manual_seed(seq.sampling.seed)
        return draw(probabilities(logits, seq.sampling), seq.generator)


class Scheduler:
    """Continuous batching: sequences join (`add`, at most `max_waiting` waiting, else QueueFull), run a step
    at a time (`step`), and leave when done or cancelled, their caches freed. Not thread-safe by itself:
    `Loop` runs it on one thread and hands it arrivals through a lock."""

    def __init__(
        self,
        step: BatchStep,
        max_sequences: int = MAX_SEQUENCES,
        max_batch_tokens: int = 32,
        prefixes: PrefixCache | None = None,
    ):
        if not 1 <= max_sequences <= MAX_SEQUENCES:
            raise ValueError(f"max_sequences={max_sequences} must be 1 to {MAX_SEQUENCES}")
        self.batch_step = step
        self.prefixes = prefixes  # finished sequences' caches, for prompts that begin as theirs did
        self.max_sequences, self.max_batch_tokens = max_sequences, max(1, max_batch_tokens)
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []
        self.steps = 0
        self.cancelled = 0  # sequences that left before their end (their client gone, or a stop string)

    @property
    def idle(self) -> bool:
        return not self.waiting and not self.running

    def add(self, seq: Sequence) -> None:
        self.waiting.append(seq)

    def plan(self) -> list[tuple[Sequence, list[int], bool]]:
        """This step's rows: each decoding sequence's last token, then prompt chunks, oldest first."""
        while self.waiting and len(self.running) < self.max_sequences:
            seq = self.waiting.popleft()
            if seq.cancelled:
                self.cancelled += 1
                continue
            if self.prefixes is not None:  # its prompt's kept first positions, copied: fed from there on
                seq.cache, seq.fed = self.prefixes.take(seq.prompt, self.batch_step.new_cache)
            else:
                seq.cache = self.batch_step.new_cache()
            self.running.append(seq)
        rows = [(seq, [seq.next_input()], True) for seq in self.running if not seq.prefilling]
        budget, fed = self.max_batch_tokens - len(rows), False
        for seq in self.running:
            if not seq.prefilling:
                continue
            if budget <= 0 and fed:  # the oldest prompt advances by at least a row, whatever the decode rows take
                break
            fed = True
            chunk = seq.prompt[seq.fed : seq.fed + max(1, budget)]
            rows.append((seq, chunk, seq.fed + len(chunk) == len(seq.prompt)))
            budget -= len(chunk)
        return rows

    def step(self) -> int:
        """One batched call; the number of rows it ran (0: nothing to do).

        A step that raises is undone (each cache cropped back to its length before it) and its sequences are
        run again one at a time: the one whose own step raises ends with the error, the others go on with the
        tokens they would have had. One request's bad input never fails another's."""
        self._drop_cancelled()
        rows = self.plan()
        if not rows:
            return 0
        before = [seq.cache.size() for seq, _, _ in rows]
        try:
            chosen = self.batch_step(rows)
        except Exception:  # noqa: BLE001 - whose fault it was is found by running each alone
            for (seq, _, _), length in zip(rows, before, strict=True):
                seq.cache.crop(seq.cache.size() - length)  # crop(n) drops the last n positions
            self._alone(rows)
        else:
            self._take(rows, chosen)
        self.running = [seq for seq in self.running if seq.cache is not None]
        self.steps += 1
        return sum(len(tokens) for _, tokens, _ in rows)

    def _take(self, rows: list[tuple[Sequence, list[int], bool]], chosen: list[int]) -> None:
        chosen = iter(chosen)
        for seq, tokens, emits in rows:
            if seq.prefilling:
                seq.fed += len(tokens)
            if emits:
                self._advance(seq, next(chosen))

    def _alone(self, rows: list[tuple[Sequence, list[int], bool]]) -> None:
        """Each row's step by itself, after a batched step raised: a row that raises again ends its sequence."""
        for row in rows:
            seq = row[0]
            try:
                chosen = self.batch_step([row])
            except Exception as e:  # noqa: BLE001 - this sequence's own input: it ends, with the reason
                seq.cache = None
                seq.emit(None, f"error: {type(e).__name__}: {message_line(e)}")
                continue
            self._take([row], chosen)

    def _advance(self, seq: Sequence, token: int) -> None:
        seq.tokens.append(token)
        done = None
        if token in self.batch_step.eos and not seq.ignore_eos:
            done = "stop"
        elif seq.stop is not None and seq.stop(seq.tokens):
            done = "stop"
        elif len(seq.tokens) >= seq.max_new_tokens:
            done = "length"
        seq.emit(token, done)
        if done:
            if self.prefixes is not None:  # every position but the last token's, which was never fed
                self.prefixes.keep(seq.prompt + seq.tokens[:-1], seq.cache)
            seq.cache = None  # the sequence's hold on it goes; the prefix cache's may stay

    def _drop_cancelled(self) -> None:
        for seq in self.running:
            if seq.cancelled and seq.cache is not None:
                seq.cache = None
                self.cancelled += 1
        self.running = [seq for seq in self.running if seq.cache is not None]

    def fail_all(self, reason: str) -> None:
        """Every sequence ends with `reason` (the step raised: the server stays up, these requests fail)."""
        for seq in [*self.running, *self.waiting]:
            seq.cache = None
            seq.emit(None, reason)
        self.running, self.waiting = [], deque()


class QueueFull(Exception):
    """More requests wait than the server's queue holds."""


class Loop:
    """The scheduler on a thread of its own: `reserve` a place from any thread (QueueFull past `max_waiting`,
    counting requests still being read and tokenized), `submit` the sequence into it (or `release` it), steps
    run while anything is waiting or running, `close` ends it (what is still running ends "cancelled")."""

    def __init__(self, scheduler: Scheduler, max_waiting: int):
        self.scheduler, self.max_waiting = scheduler, max_waiting
        self.lock = threading.Condition()
        self.arrivals: deque[Sequence] = deque()
        self.reserved = 0  # places held by requests not yet submitted (their prompts being tokenized)
        self.closing = False
        self.error: str | None = None
        self.thread = threading.Thread(target=self._run, name="quantspec-batching", daemon=True)
        self.thread.start()

    def waiting(self) -> int:
        with self.lock:
            return len(self.arrivals) + len(self.scheduler.waiting) + self.reserved

    def running(self) -> int:
        return len(self.scheduler.running)

    def reserve(self) -> None:
        """Hold a place in the queue for a request about to be tokenized (QueueFull where none is left)."""
        with self.lock:
            if self.closing:
                raise QueueFull("the server is shutting down")
            if len(self.arrivals) + len(self.scheduler.waiting) + self.reserved >= self.max_waiting:
                raise QueueFull(f"{self.max_waiting} requests are already waiting")
            self.reserved += 1

    def release(self) -> None:
        """Give back a reserved place unused (the request was refused)."""
        with self.lock:
            self.reserved -= 1

    def submit(self, seq: Sequence) -> None:
        """The sequence takes its reserved place (QueueFull if the server is shutting down)."""
        with self.lock:
            self.reserved -= 1
            if self.closing:
                raise QueueFull("the server is shutting down")
            self.arrivals.append(seq)
            self.lock.notify()

    def close(self, timeout: float = 10.0) -> None:
        with self.lock:
            self.closing = True
            self.lock.notify()
        self.thread.join(timeout)

    def _run(self) -> None:
        scheduler = self.scheduler
        while True:
            with self.lock:
                while not self.closing and not self.arrivals and scheduler.idle:
                    self.lock.wait()
                if self.closing:
                    break
                while self.arrivals:
                    scheduler.add(self.arrivals.popleft())
            try:
                scheduler.step()
            except Exception as e:  # noqa: BLE001 - the requests in flight fail with the reason; the server lives
                scheduler.fail_all(f"error: {type(e).__name__}: {e}")
        with self.lock:
            pending = list(self.arrivals)
            self.arrivals.clear()
        for seq in pending:
            scheduler.add(seq)
        scheduler.fail_all("cancelled")


def for_model(model) -> cpp_step.CompiledSteps:
    """The model's C++ step, which batching runs on; Unbatchable (one line) where it has none."""
    compiled = cpp_step.for_model(model)
    if compiled is None:
        raise Unbatchable(
            f"{model.config.model_type} with these weights has no C++ step to batch on: serving needs engine=native "
            "with quantspec's kernels loaded, and a Gemma 3, Llama or Qwen2 model"
        )
    return compiled
