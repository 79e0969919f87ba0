"""quantspec's own decode loop (engine=native): the model's forward over a KV cache we hold.

Three moves, each one forward call: `prefill` (the prompt, logits for its last position only),
`step` (one token) and `verify` (k draft tokens at once, logits for each), plus `rollback` to drop
rejected positions from the cache. Greedy output is token-for-token that of transformers' generate
(tested on every tiny architecture); what it saves is generate's per-step machinery.
"""

from __future__ import annotations

import inspect
import time

import torch

from src.engine import cpp_step, python_step, static_step
from src.engine.config import STEP_PATHS
from src.engine.generation import Generation, Request, choose, eos_ban, eos_ids
from src.engine.kvcache import growing_cache
from src.kernels import MAX_ROWS


class Decoder:
    """One sequence's KV cache and the forward calls that extend it.

    `path` (engine.step_path): cpp: where src.engine.cpp_step covers the model, every step and
    verification is one C++ call into a cache of its own (a prompt longer than MAX_FAST goes through
    transformers' forward first, its cache then handed over), else as python; python: steps and
    verifications of at most MAX_FAST tokens through src.engine.python_step where it covers the context;
    transformers' forward otherwise, and for transformers.
    """

    MAX_FAST = MAX_ROWS  # longer inputs (prefills) take transformers' forward, where its overhead is small

    def __init__(self, model, path: str = "transformers"):
        self.model = model
        self.cache = growing_cache(model.config)
        self.compiled, self.fast = _steps(model, path)
        self.own = None  # the C++ step's cache, once it holds the sequence
        # transformers 5 names the cache argument `cache` (past_key_values warns on every call); 4.x knows only
        # past_key_values and would take `cache` into **kwargs unused
        self.cache_arg = "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"

    def _forward(self, ids: torch.Tensor, keep: int) -> torch.Tensor:
        new = ids.shape[1]
        if self.compiled is not None:
            if self.own is None:
                if new > self.MAX_FAST:  # a long prompt: ATen's GEMMs, then the cache handed to C++
                    logits = self._transformers(ids, keep)
                    self.own = self.compiled.take(self.cache)
                    self.cache = None
                    return logits
                self.own = self.compiled.new_cache()
            return self.compiled(ids, self.own, keep)
        if self.fast is not None and new <= self.MAX_FAST and self.fast.covers(self.length, new):
            return self.fast(ids, self.cache, keep)
        return self._transformers(ids, keep)

    def _transformers(self, ids: torch.Tensor, keep: int) -> torch.Tensor:
        out = self.model(input_ids=ids, use_cache=True, logits_to_keep=keep, **{self.cache_arg: self.cache})
        return out.logits[0]

    def prefill(self, prompt_ids: torch.Tensor) -> torch.Tensor:
        """prompt [1, n] -> logits [V] for the next token."""
        return self._forward(prompt_ids, 1)[-1]

    def step(self, token: int) -> torch.Tensor:
        return self._forward(torch.tensor([[token]], device=self.model.device), 1)[-1]

    def greedy_step(self, token: int, banned: torch.Tensor) -> int | None:
        """step() and the greedy choice over its logits (`banned` ids left out) in one C++ call, the
        logits never materialised; None, with nothing run, where the C++ step does not compute the head."""
        if self.own is None or self.compiled is None:
            return None
        # the C++ step runs on the CPU: no device to look up (transformers' model.device walks the parameters)
        return self.compiled.greedy(torch.tensor([[token]]), self.own, banned)

    def verify(self, tokens: list[int]) -> torch.Tensor:
        """k tokens in one forward -> logits [k, V]: row i predicts the token after tokens[i]."""
        return self._forward(torch.tensor([tokens], device=self.model.device), len(tokens))

    def rollback(self, n: int) -> None:
        """Drop the last n positions (a rejected draft's); n = 0 too restricts a sliding layer past its window to
        the window again (src.engine.kvcache.GrowingSlidingLayer keeps each forward's states until a crop)."""
        if n and self.own is not None:
            self.own.crop(n)
        elif self.own is None:
            self.cache.crop(-n)

    @property
    def length(self) -> int:
        return self.own.size() if self.own is not None else self.cache.get_seq_length()


def resolved(model, path: str) -> str:
    """engine.step_path as this model runs it: cpp off the CPU is the static step (the C++ step is a CPU
    step, and the Python loop's ~40 launches a layer leave a GPU waiting on the host), where it serves the
    family."""
    if path == "cpp" and model.device.type != "cpu" and static_step.for_model(model) is not None:
        return "static"
    return path


def decoder(model, path: str, reserve: int = 0, compile: bool = False):
    """The Decoder for engine.step_path=`path`: the static step's (src.engine.static_step) or this module's."""
    path = resolved(model, path)
    return static_step.Decoder(model, reserve, compile) if path == "static" else Decoder(model, path)


def _steps(model, path: str):
    """(the C++ step, the Python loop) a Decoder with engine.step_path=`path` uses for this model: at most
    one of them, None where neither covers it."""
    if path not in STEP_PATHS:  # a caller's own path, never a config's (validated): named, not run as transformers
        raise ValueError(f"unknown step path {path!r}; known: {', '.join(STEP_PATHS)}")
    compiled = cpp_step.for_model(model) if path == "cpp" else None
    lean = path in ("cpp", "python") and compiled is None
    return compiled, python_step.for_model(model) if lean else None


def executed_path(model, path: str) -> str:
    """The step path a Decoder with engine.step_path=`path` runs for this model (param
    executed.step_path): cpp where the C++ step covers it, python where the Python loop does, static
    where the static step runs (asked, or cpp's choice off the CPU)."""
    path = resolved(model, path)
    if path == "static":
        return "static" if static_step.for_model(model) is not None else "transformers"
    compiled, fast = _steps(model, path)
    return "cpp" if compiled is not None else "python" if fast is not None else "transformers"


@torch.inference_mode()
def generate(model, request: Request, path: str = "transformers", compile: bool = False) -> Generation:
    """One prompt on quantspec's loop. `path` is engine.step_path (see Decoder; static: src.engine.static_step's loop,
    `compile` its engine.compile)."""
    if executed_path(model, path) == "static":
        return static_step.generate(model, request, compile=compile)
    input_ids, max_new_tokens, exact, sampling, pad_token_id, stop = request
    eos, ban = eos_ids(model), eos_ban(model, exact)
    generator = torch.Generator().manual_seed(sampling.seed) if sampling.do_sample else None

    def pick(logits: torch.Tensor) -> int:
        return choose(ban(logits), sampling, generator)

    def advance(token: int) -> int:
        if not sampling.do_sample:  # greedy: the argmax in the C++ step where it computes the head
            chosen = decoder.greedy_step(token, banned)
            if chosen is not None:
                return chosen
        return pick(decoder.step(token))

    decoder = Decoder(model, path)
    banned = torch.tensor(sorted(eos) if exact else [], dtype=torch.long)  # as eos_ban's -inf does
    input_ids = input_ids.to(model.device)
    start = time.perf_counter()
    token = pick(decoder.prefill(input_ids))
    tokens, times = [token], [time.perf_counter()]
    while len(tokens) < max_new_tokens and token not in eos and not (stop and stop(tokens)):
        token = advance(token)
        tokens.append(token)
        times.append(time.perf_counter())
    return Generation(input_ids.shape[1], tokens, start, times, time.perf_counter())
