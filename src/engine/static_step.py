"""A decode step whose shapes never change (engine.step_path=static): the same on any device.

The other step paths grow the KV cache a position a step and read the sequence length as a Python int,
so every step is a new shape: a CUDA graph cannot be replayed, torch.compile would recompile at every
position, and an attention backend that plans per shape plans every step. Here:

- the cache is one buffer per layer, sized to the run (prompt + new tokens + draft, rounded up to
  ROUND), written in place at a position tensor (index_copy_);
- a step is a pure tensor function `(ids [1, k], pos [k]) -> logits [k, V]`: rotary angles gathered
  from a table by position, attention over the whole buffer with a mask made from the positions
  (causality, and each sliding layer's window), q/k/v and gate/up as one linear each (fused once at
  load, src.engine.fused), RMSNorm through F.rms_norm. No `.item()`, no Python int read from a tensor;
- a rejected draft is rolled back by moving the position: the rows past it are masked until rewritten.

So one shape per k, and `Static.capture` records it once: a CUDA graph replayed per token where the
device has graphs, torch.compile (engine.compile) where asked, the eager step otherwise. The greedy loop
(`generate`) keeps the next token on the device (argmax over logits plus the end-of-sequence ban as a
bias) and reads it back once per token, for the stop check.

It serves every family src.models.families describes, through src.engine.layers' one layer loop (the Python
step path's).
"""

from __future__ import annotations

import time
from collections.abc import Callable

import torch
from torch import nn
from torch.nn import functional as F

from src.engine import layers
from src.engine.fused import Projection
from src.engine.generation import Generation, Request, Sampling, eos_ids, probabilities
from src.models import families
from src.models.families import Family

ROUND = 64  # cache positions are allocated in blocks of this many (a graph per k, not per length)


def _fixed(t: torch.Tensor) -> torch.Tensor:
    """A tensor the step reads or writes in place at the same address for the run (the cache, the tables):
    torch.compile's CUDA graphs then take it as it is, where an input of theirs is copied in at every replay
    (a 7B cache, gigabytes, at every token)."""
    torch._dynamo.mark_static_address(t)
    return t


class Cache:
    """Keys and values [1, kv_heads, capacity, head_dim] per layer, and how many positions hold the sequence."""

    def __init__(self, shapes: list[tuple[int, int]], capacity: int, dtype: torch.dtype, device):
        capacity = -(-capacity // ROUND) * ROUND
        self.keys = [_fixed(torch.zeros(1, h, capacity, d, dtype=dtype, device=device)) for h, d in shapes]
        self.values = [_fixed(torch.zeros_like(k)) for k in self.keys]
        self.length = 0  # positions written and kept (the host's count: never read from a tensor)

    @property
    def capacity(self) -> int:
        return self.keys[0].shape[2]

    def grow(self, needed: int) -> bool:
        """Room for `needed` positions, reallocating (and copying) where there is none; True if it moved."""
        if needed <= self.capacity:
            return False
        capacity = -(-max(needed, 2 * self.capacity) // ROUND) * ROUND
        for buffers in (self.keys, self.values):
            for i, old in enumerate(buffers):
                new = old.new_zeros(*old.shape[:2], capacity, old.shape[3])
                new[:, :, : old.shape[2]].copy_(old)
                buffers[i] = _fixed(new)
        return True


def _norm(module: nn.Module, family: Family) -> Callable[[torch.Tensor], torch.Tensor]:
    """A norm as a pure function: transformers' RMSNorm (or src.kernels' fused one) as F.rms_norm over float32, as
    transformers rounds (Gemma scales by (1 + w) before the cast back, Llama/Qwen2 by w after it); a LayerNorm as
    itself."""
    if family.norm == "layer":
        return module
    eps = float(getattr(module, "eps", getattr(module, "variance_epsilon", 1e-6)))
    shape = (module.weight.shape[-1],)
    if family.norm == "gemma_rms":
        scale = _fixed(1.0 + module.weight.detach().float())
        return lambda x: (F.rms_norm(x.float(), shape, eps=eps) * scale).to(x.dtype)
    weight = module.weight  # the parameter itself: compiled graphs take parameters as they are
    return lambda x: weight * F.rms_norm(x.float(), shape, eps=eps).to(x.dtype)


class Step(layers.Loop):
    """A family's pure step over a Cache's buffers: src.engine.layers' loop, rotary positions gathered from tables
    by position, attention over the whole buffer under a mask made from the positions."""

    def __init__(self, model, family: Family, positions: int):
        # linears over one input as one call: float nn.Linears concatenated into one weight too (the parts' weights
        # become its views, nothing held twice; on a GPU one launch instead of three)
        super().__init__(model, family, norm=lambda m: _norm(m, family), linears=lambda p: Projection(p, plain=True))
        weight = model.get_input_embeddings().weight
        self.dtype, self.device = weight.dtype, weight.device
        self.rotary = {name: Rotary(make, positions, self.dtype, self.device) for name, make in self.tables.items()}

    def shapes(self) -> list[tuple[int, int]]:
        cfg = self.model.config
        heads = getattr(cfg, "num_key_value_heads", None) or cfg.num_attention_heads
        return [(heads, self.head_dim)] * len(self.types)

    def new_cache(self, capacity: int) -> Cache:
        return Cache(self.shapes(), capacity, self.dtype, self.device)

    def masks(self, pos: torch.Tensor, capacity: int) -> dict[str, torch.Tensor]:
        """[k, capacity] bool per layer type: query at position p sees key j when j <= p (and, in a sliding
        layer, p - j < window: transformers' sliding mask)."""
        keys = torch.arange(capacity, device=pos.device)[None, :]
        seen = keys <= pos[:, None]
        out = {"full_attention": seen}
        if self.window is not None:
            out["sliding_attention"] = seen & (pos[:, None] - keys < self.window)
        return out

    def rope(self, i, q, key, step):
        return self.rotary[self.table[i]](q, key, step[0]) if self.rotary else (q, key)

    def attend(self, i, q, key, value, step) -> torch.Tensor:
        """Write this step's keys and values at its positions, attend over the whole buffer under the layer type's
        mask: [1, heads, k, head_dim] -> [1, k, heads * head_dim]."""
        pos, masks, keys, values = step
        cache_k, cache_v = keys[i], values[i]
        cache_k.index_copy_(2, pos, key)
        cache_v.index_copy_(2, pos, value)
        mask = masks[self.types[i]]
        out = F.scaled_dot_product_attention(q, cache_k, cache_v, attn_mask=mask, scale=self.scaling, enable_gqa=True)
        return out.transpose(1, 2).reshape(1, q.shape[2], -1)

    def rotaries(self) -> list[Rotary]:
        return list(self.rotary.values())

    def __call__(self, ids: torch.Tensor, pos: torch.Tensor, keys: list, values: list) -> torch.Tensor:
        """ids [1, k], pos [k] (the positions they take) -> logits [k, V]; the cache written in place."""
        step = (pos, self.masks(pos, keys[0].shape[2]), keys, values)
        h = self.embed(ids, pos)
        for i in range(len(self.types)):
            h = self.layer(i, h, step)
        return self.finish(h)[0]


class Rotary:
    """cos and sin tables [positions, head_dim] from the model's own rotary embedding (its arithmetic, in
    its dtype), sin's first half negated so that rotate_half is a roll: x * cos + roll(x) * sin."""

    def __init__(self, make: Callable[[torch.Tensor, torch.Tensor], tuple], positions: int, dtype, device):
        self.make, self.dtype, self.device = make, dtype, device
        self.cos = self.sin = torch.empty(0, device=device)
        self.cover(positions)

    def cover(self, positions: int) -> None:
        """Tables for at least `positions` (rebuilt at the cache's capacity when it grows)."""
        if positions <= self.cos.shape[0]:
            return
        probe = torch.empty(1, 1, 1, dtype=self.dtype, device=self.device)
        cos, sin = layers.signed(self.make(probe, torch.arange(positions, device=self.device)[None]))
        self.cos = _fixed(cos[0, 0].contiguous())
        self.sin = _fixed(sin[0, 0].contiguous())

    def __call__(self, q: torch.Tensor, key: torch.Tensor, pos: torch.Tensor):
        return layers.rotated(q, key, self.cos[pos][None, None], self.sin[pos][None, None])


FIRST_POSITIONS = 1024  # rotary positions tabulated at first; a longer cache extends the tables


def for_model(model) -> Step | None:
    """The static step for this model (built once and kept on it: building fuses its linears), or None for a
    family it does not serve."""
    step = model.__dict__.get("_quantspec_static")
    if step is None:
        family = families.of(model)
        step = Step(model, family, FIRST_POSITIONS) if family else False
        model.__dict__["_quantspec_static"] = step
    return step or None


def _greedy(logits: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
    """The next token [1] from the last row of logits, on the device: argmax over float32 (as generate
    does) plus the ban (0, or -inf at end-of-sequence while `exact`)."""
    return (logits[-1].float() + bias).argmax(-1, keepdim=True)


def _draw(logits: torch.Tensor, bias: torch.Tensor, sampling: Sampling, generator: torch.Generator) -> torch.Tensor:
    """A seeded draw [1] on the device with no host read: argmax of p / E, E ~ Exp(1), picks token i with
    probability p_i (the exponential race, as gpt-fast samples)."""
    p = probabilities(logits[-1:] + bias, sampling)[0]
    return (p / torch.empty_like(p).exponential_(generator=generator)).argmax(-1, keepdim=True)


class Runner:
    """How a step of k tokens runs: eager; a CUDA graph per k captured at its first call and replayed after
    (`graph`: the same kernels on the same buffers, so bit for bit the eager step); or torch.compile
    (`compile`: fullgraph, no dynamic shapes; reduce-overhead, graphs of its own, on CUDA). Inputs are
    copied into buffers the capture owns; a Cache that grows invalidates what was captured."""

    MAX_CAPTURED = 16  # longer calls (prefills) run eager: one shape each, not worth a graph

    def __init__(self, fn: Callable, mode: str, device: torch.device, backend: str | None = None):
        self.fn, self.mode, self.device = fn, mode, device
        if mode == "compile":
            options = {"fullgraph": True, "dynamic": False}
            if backend is not None:
                options["backend"] = backend
            elif device.type == "cuda":
                options["mode"] = "reduce-overhead"
            self.compiled = torch.compile(fn, **options)
        self.graphs: dict[int, tuple] = {}

    def reset(self) -> None:
        self.graphs.clear()

    def __call__(self, *inputs: torch.Tensor):
        k = inputs[0].shape[-1]
        if self.mode == "eager" or k > self.MAX_CAPTURED:
            return self.fn(*inputs)
        if self.mode == "compile":
            return self.compiled(*inputs)
        if k not in self.graphs:
            self.graphs[k] = self._capture(inputs)
        graph, buffers, out = self.graphs[k]
        for buffer, value in zip(buffers, inputs):
            if buffer is not value:
                buffer.copy_(value)
        graph.replay()
        return out

    def _capture(self, inputs: tuple[torch.Tensor, ...]) -> tuple:
        """torch's recipe: warm up on a side stream (allocator pools, lazy inits), then record one call. The
        warm-up calls write the cache at the inputs' positions, which the recorded call writes again."""
        buffers = tuple(t.clone() for t in inputs)
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(2):
                self.fn(*buffers)
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            out = self.fn(*buffers)
        return graph, buffers, out


def capture_mode(device: torch.device, compile: bool) -> str:
    """compile where asked (engine.compile), a CUDA graph where the device has them, else eager."""
    return "compile" if compile else "graph" if device.type == "cuda" else "eager"


class Decoder:
    """native.Decoder's interface (prefill, step, verify, rollback, length) over the static step: the
    speculative loop and a model drafter run on it unchanged. Each call returns logits; `next_token` is
    the greedy loop's step, its token left on the device."""

    def __init__(self, model, reserve: int = 0, compile: bool = False, backend: str | None = None):
        self.model, self.reserve = model, reserve
        self.step_fn = for_model(model)
        if self.step_fn is None:
            raise ValueError(f"the static step does not serve {model.config.model_type} models")
        device = self.step_fn.device
        self.mode = capture_mode(device, compile)
        self.cache: Cache | None = None
        self.tables: tuple[int, ...] = ()  # where the rotary tables were when the graphs were captured
        self.logits = Runner(self._logits, self.mode, device, backend)
        self.greedy = Runner(self._next, self.mode, device, backend)
        self.bias = _fixed(torch.zeros(model.config.get_text_config().vocab_size, device=device))

    def _logits(self, ids: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
        return self.step_fn(ids, pos, self.cache.keys, self.cache.values)

    def _next(self, ids: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
        """One token's step straight to the next token."""
        return _greedy(self._logits(ids, pos), self.bias)

    def _positions(self, k: int) -> torch.Tensor:
        """The next k positions, room made for them; the host's count moves past them."""
        start = 0 if self.cache is None else self.cache.length
        if self.cache is None:
            self.cache = self.step_fn.new_cache(start + k + self.reserve)
        elif self.cache.grow(start + k):
            self._recapture()
        for rotary in self.step_fn.rotaries():
            rotary.cover(self.cache.capacity)
        tables = tuple(r.cos.data_ptr() for r in self.step_fn.rotaries())
        if tables != self.tables:  # rebuilt (this or another decoder of the model outgrew them): recapture
            self._recapture()
            self.tables = tables
        self.cache.length = start + k
        return torch.arange(start, start + k, device=self.step_fn.device)

    def _recapture(self) -> None:
        """What was captured read buffers that moved: capture again at the next call."""
        self.logits.reset()
        self.greedy.reset()

    def _forward(self, ids: torch.Tensor, keep: int) -> torch.Tensor:
        out = self.logits(ids, self._positions(ids.shape[1]))
        return out[-keep:].clone() if self.mode != "eager" else out[-keep:]  # a replayed graph reuses its output

    def prefill(self, prompt_ids: torch.Tensor) -> torch.Tensor:
        return self._forward(prompt_ids.to(self.step_fn.device), 1)[-1]

    def step(self, token: int | torch.Tensor) -> torch.Tensor:
        """One token (an int, or a tensor on the device) -> logits [V] for the next."""
        ids = (
            token.view(1, 1) if isinstance(token, torch.Tensor) else torch.tensor([[token]], device=self.step_fn.device)
        )
        return self._forward(ids, 1)[-1]

    def verify(self, tokens: list[int]) -> torch.Tensor:
        return self._forward(torch.tensor([tokens], device=self.step_fn.device), len(tokens))

    def next_token(self, ids: torch.Tensor) -> torch.Tensor:
        """ids [1, 1] on the device -> the greedy next token [1] on the device; nothing read by the host."""
        return self.greedy(ids, self._positions(1))

    def rollback(self, n: int) -> None:
        """Drop the last n positions: masked from here on, overwritten by the next writes."""
        self.cache.length -= n

    @property
    def length(self) -> int:
        return 0 if self.cache is None else self.cache.length


class Clock:
    """When each token existed, on one clock (perf_counter). On the CPU a step is done when its call returns:
    perf_counter then. On CUDA the host runs ahead of the device, so each token's time is a CUDA event recorded
    after its step, read once at the end as an offset from an anchor event recorded while the device was idle
    (after a read back), whose perf_counter time is known."""

    def __init__(self, device: torch.device):
        self.cuda = device.type == "cuda"
        self.start = time.perf_counter()
        if self.cuda:
            self.anchor = torch.cuda.Event(enable_timing=True)
            self.anchor.record()
        self.marks: list = []

    def mark(self) -> None:
        if self.cuda:
            event = torch.cuda.Event(enable_timing=True)
            event.record()
            self.marks.append(event)
        else:
            self.marks.append(time.perf_counter())

    def times(self) -> list[float]:
        if not self.cuda:
            return self.marks
        torch.cuda.synchronize()
        return [self.start + self.anchor.elapsed_time(e) / 1e3 for e in self.marks]


@torch.inference_mode()
def generate(model, request: Request, compile: bool = False, backend: str | None = None) -> Generation:
    """native.generate's loop on the static step: each token chosen on the device (argmax, or a seeded draw) and
    fed back there. The host reads a token only where the loop must look at it (an end-of-sequence that may end
    it, a stop check): otherwise the steps are queued without a wait and all tokens read at the end. Times by
    Clock."""
    input_ids, max_new_tokens, exact, sampling, pad_token_id, stop = request
    decoder = Decoder(model, reserve=max_new_tokens, compile=compile, backend=backend)
    device, eos = decoder.step_fn.device, eos_ids(model)
    if exact and eos:
        decoder.bias[sorted(eos)] = float("-inf")  # as eos_ban does: min_new_tokens' rule
    generator = torch.Generator(device).manual_seed(sampling.seed) if sampling.do_sample else None

    def advance(nxt: torch.Tensor) -> torch.Tensor:
        if generator is None:
            return decoder.next_token(nxt.view(1, 1)).clone()  # a replayed graph's output: kept apart from it
        # a draw from the device's generator, eager (a captured graph would replay one draw)
        return _draw(decoder.step(nxt)[None], decoder.bias, sampling, generator)

    start = time.perf_counter()
    logits = decoder.prefill(input_ids)
    nxt = _draw(logits[None], decoder.bias, sampling, generator) if generator else _greedy(logits[None], decoder.bias)
    tokens = [int(nxt)]  # the first token read: its time is the prefill's, and the device is idle for the anchor
    clock = Clock(device)
    if stop is not None or (eos and not exact):  # the loop looks at every token: one read each
        while len(tokens) < max_new_tokens and tokens[-1] not in eos and not (stop and stop(tokens)):
            nxt = advance(nxt)
            tokens.append(int(nxt))
            clock.mark()
    else:  # nothing to look at: max_new_tokens - 1 steps queued, one read at the end
        out = torch.empty(max_new_tokens - 1, dtype=torch.long, device=device)
        for i in range(max_new_tokens - 1):
            nxt = advance(nxt)
            out[i : i + 1].copy_(nxt)
            clock.mark()
        tokens += out.tolist()
    return Generation(input_ids.shape[1], tokens, start, [clock.start, *clock.times()], time.perf_counter())
