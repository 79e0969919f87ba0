"""The decode step as one C++ call (src/kernels/step.cpp), for models on quantspec's kernels.

src.engine.python_step took transformers' forward out of a step; what it left was still ~1000 operator
calls a step from Python (~2.5 ms of the fixed cost per token on Gemma 3 270M, measured by
scripts/bench_step.py: as much as streaming its 4-bit layers). Here the same loop runs in C++: the
model's weights (the embedding, the fused q/k/v and gate/up kernels of src.engine.fused, the norms, the
head) are handed to a `torch.classes.quantspec.Stepper` once per model, and a step is one call from
token ids to logits, or for greedy decoding to the next token (the argmax taken where the head's columns
are computed). The sequence's keys and values live in a `StepCache` of its own, sliding windows
included, so the step never leaves C++ for a mask or a window. The logits are the Python step path's,
bit for bit (tests/engine/test_cpp_step.py, every family and precision).

It covers the families whose description says step.cpp runs them (src.models.families: every one but OPT) whose
every linear runs on quantspec's kernels (engine=native with kernels loaded); otherwise the Decoder keeps src.engine.python_step.
"""

from __future__ import annotations

import torch

from src.engine import layers, python_step
from src.kernels import MAX_ROWS, format_number, modules
from src.quant.linear import QuantLinear

QKV, OUT, GATE_UP, DOWN = range(4)  # step.cpp's Slot
EMBEDDINGS = ("Embedding", "Gemma3TextScaledWordEmbedding")  # a lookup, and Gemma's times its scale
ACTIVATIONS = {"GELUTanh": "gelu_tanh", "PytorchGELUTanh": "gelu_tanh", "SiLUActivation": "silu", "SiLU": "silu"}
FIRST_TABLE = 1024  # rotary positions tabulated at first; doubled when a sequence outgrows them


class Unsupported(Exception):
    """This model has a part the C++ step does not reproduce exactly; the Python step path runs it."""


def _call(module, act: torch.dtype) -> tuple[int, list[torch.Tensor], list[torch.Tensor], int, bool]:
    """(format number, tensors, [bias], group, bf16 input) as step.cpp's Call runs it: what the module's forward
    does for a few rows (src.kernels.modules, and each quantized module's step_call: src.quant.linear)."""
    if isinstance(module, modules.GemvLinear):
        if module.weight.dtype != act:  # its forward would take F.linear
            raise Unsupported(f"a {module.weight.dtype} linear in a {act} model")
        call = format_number("float"), [module.weight.detach()], 0, act == torch.bfloat16
    else:
        call = module.step_call(act) if isinstance(module, QuantLinear) else None
    if call is None:  # a cut-down head, ATen's kernels
        raise Unsupported(f"{type(module).__name__} is not on quantspec's kernels")
    fmt, tensors, group, bf16_in = call
    bias = [module.bias.detach()] if module.bias is not None else []
    return fmt, tensors, bias, group, bf16_in


def _norm(module, act: torch.dtype, conv: dict) -> torch.Tensor:
    if not isinstance(module, modules.FusedRMSNorm) or module.weight.dtype != act:
        raise Unsupported(f"{type(module).__name__} is not a fused {act} RMSNorm")
    # one epsilon and one convention for the whole model (step.cpp holds one of each)
    if conv.setdefault("eps", module.eps) != module.eps or conv.setdefault("gemma", module.gemma) != module.gemma:
        raise Unsupported("norms with different epsilons or conventions")
    return module.weight.detach()


class CompiledSteps:
    """A model's Stepper, and the rotary tables it reads. `new_cache()` starts a sequence; `take(cache)`
    hands over transformers' cache after a prefill through its forward; calling it runs [1, k] new
    tokens (in pieces of MAX_ROWS) and returns logits [keep, V]; `greedy` returns the next token.
    A head the stepper cannot run (a draft's cut-down head, a soft-capped one) runs in Python after it."""

    def __init__(self, model, steps: python_step.Steps):
        if not steps.own_attention:
            raise Unsupported("attention is not quantspec's kernel (head dim, or no kernels)")
        self.model, self.steps = model, steps
        family = steps.family
        if not family.cpp_step:
            raise Unsupported(f"step.cpp does not run the {family.name} family's layers")
        cfg = model.config
        act = steps.embedding.weight.dtype
        if act not in (torch.float32, torch.bfloat16):
            raise Unsupported(f"{act} activations")
        name = type(steps.parts[0].act).__name__
        if name not in ACTIVATIONS:
            raise Unsupported(f"activation {name}")
        heads, kv_heads = cfg.num_attention_heads, cfg.num_key_value_heads
        conv: dict = {}
        rope_index = {name: i for i, name in enumerate(steps.tables)}
        slots = []  # gathered first: nothing reaches C++ unless the whole model is supported
        for i, layer in enumerate(steps.layers):
            slots.append(self._layer(i, layer, act, conv, rope_index))
        final = _norm(model.get_submodule(family.final_norm), act, conv)
        embedding = steps.embedding
        if type(embedding).__name__ not in EMBEDDINGS:
            raise Unsupported(f"a {type(embedding).__name__} embedding")
        scale = getattr(embedding, "embed_scale", None)  # Gemma's sqrt(hidden), multiplied in the weight's type
        self.stepper = torch.classes.quantspec.Stepper(
            heads, kv_heads, steps.head_dim, float(steps.scaling), float(conv["eps"]), conv["gemma"], ACTIVATIONS[name]
        )
        for i, (weights, rope, window, calls) in enumerate(slots):
            self.stepper.add_layer(weights, rope, int(window))
            for slot, (fmt, tensors, bias, group, bf16_in) in calls:
                self.stepper.add_call(i, slot, fmt, tensors, bias, group, bf16_in)
        self.stepper.set_x8_rows(model.__dict__.get("_quantspec_x8_rows", 0))
        self.stepper.set_final_norm(final)
        self.stepper.set_embedding(embedding.weight.detach(), [] if scale is None else [scale])
        self.act = act
        self.positions = 0
        self.softcap = steps.softcap
        self.head, self.fused = None, False  # the lm_head module the stepper holds (_fused_head)

    def _layer(self, i: int, layer, act: torch.dtype, conv: dict, rope_index: dict) -> tuple:
        """One layer's norms, rotary table, window and kernel calls, as the stepper takes them."""
        steps, family = self.steps, self.steps.family
        get = layer.get_submodule
        # step.cpp's six norm slots: before and after attention, before and after the MLP, q's and k's
        names = [family.attn_norm, family.post_attn_norm, family.mlp_norm, family.post_mlp_norm]
        names += list(family.qk_norms or (None, None))
        norms = [get(n) if n else None for n in names]
        window = self.model.config.sliding_window if steps.types[i] == "sliding_attention" else 0
        weights = [torch.empty(0) if n is None else _norm(n, act, conv) for n in norms]
        calls = [
            [(QKV, _call(m, act)) for m, _ in steps.parts[i].attn_in.calls],
            [(OUT, _call(steps.parts[i].out, act))],
            [(GATE_UP, _call(m, act)) for m, _ in steps.parts[i].mlp_in.calls],
            [(DOWN, _call(steps.parts[i].down, act))],
        ]
        return weights, rope_index[steps.table[i]], window or 0, [c for group in calls for c in group]

    def _tables(self, needed: int) -> None:
        """Rotary cos/sin for positions 0 .. needed-1 and more, from the model's own rotary embedding
        (each position's values are those a step would compute for it alone)."""
        if needed <= self.positions:
            return
        size = max(FIRST_TABLE, self.positions * 2, needed)
        dummy = torch.zeros(1, size, 1, dtype=self.act)
        positions = torch.arange(size)[None]
        for i, make in enumerate(self.steps.tables.values()):
            cos, sin = layers.signed(make(dummy, positions))
            self.stepper.set_rope(i, cos.reshape(size, -1).contiguous(), sin.reshape(size, -1).contiguous())
        self.positions = size

    def new_cache(self):
        return torch.classes.quantspec.StepCache()

    def take(self, cache) -> object:
        """transformers' cache (after a prefill through its forward) copied into a StepCache."""
        own = self.new_cache()
        length = cache.get_seq_length()
        for i, layer in enumerate(cache.layers):
            self.stepper.load(own, i, layer.keys[0], layer.values[0], length)
        return own

    def _fused_head(self) -> bool:
        """Whether the stepper computes the head: the model's lm_head on quantspec's kernels and no
        soft-capping. Checked each call: a draft's head may be cut down (src.engine.subset_head) after."""
        head = self.model.lm_head
        if head is not self.head:
            self.head = head
            try:
                if self.softcap is not None:
                    raise Unsupported("a soft-capped head")
                self.stepper.set_head(*_call(head, self.act))
                self.fused = True
            except Unsupported:
                self.stepper.clear_head()
                self.fused = False
        return self.fused

    def _layers(self, ids: torch.Tensor, kv) -> torch.Tensor:
        """ids [1, k]: every piece of MAX_ROWS tokens but the last run through the layers (the kernels'
        regime; a row's result does not depend on the rest), the last piece's ids returned."""
        n = ids.shape[1]
        self._tables(kv.size() + n)
        ids = ids[0].cpu()
        last = (n - 1) // MAX_ROWS * MAX_ROWS
        for start in range(0, last, MAX_ROWS):
            self.stepper.forward(ids[start : start + MAX_ROWS], kv, 1)
        return ids[last:]

    def __call__(self, ids: torch.Tensor, kv, keep: int) -> torch.Tensor:
        n = ids.shape[1]
        if keep > (n - 1) % MAX_ROWS + 1:
            raise ValueError(f"logits for {keep} positions of {n}: at most the last {MAX_ROWS}-row piece's")
        piece = self._layers(ids, kv)
        if self._fused_head():
            return self.stepper.logits(piece, kv, keep)
        logits = self.model.lm_head.forward(self.stepper.forward(piece, kv, keep)[None])
        if self.softcap is not None:
            logits = torch.tanh(logits / self.softcap) * self.softcap
        return logits[0]

    def greedy(self, ids: torch.Tensor, kv, banned: torch.Tensor) -> int | None:
        """The greedy next token after ids, `banned` ids left out, the argmax taken where the head's
        columns are computed; None (nothing run) where the head is not the stepper's."""
        if not self._fused_head():
            return None
        return self.stepper.greedy(self._layers(ids, kv), kv, banned)


# A batched step's projections take int8 activations from this many rows where precision.batch_activations=int8
# (step.cpp's x8_rows). A whole step of the default model (2-core AVX-512 EPYC, 2026-12-07, in turns, 2 rounds): at 4
# rows the int8 step took 21-23 ms against the 16-bit one's 17-20 (unpacking the 262,144-row head's panels costs as
# much as its dot products there), at 5 rows 24-26 against 26-27, at 6 26 against 35-36, 8 24-27 against 37-44, 16
# 35-39 against 77-86. Fewer rows keep the 16-bit gemv.
X8_ROWS = 5


def set_batch_activations(model, kind: str) -> None:
    """A batched step's activations at the grouped linears (precision.batch_activations): int16 as every other
    step, or int8 from X8_ROWS rows (single sequences' steps and a draft's verification stay 16-bit)."""
    rows = X8_ROWS if kind == "int8" else 0
    model.__dict__["_quantspec_x8_rows"] = rows
    steps = model.__dict__.get("_quantspec_cpp_step")
    if steps:
        steps.stepper.set_x8_rows(rows)


def adapt_threads(model, on: bool) -> None:
    """Whether the model's C++ step (where it has one) picks its thread count per call (engine.adapt_threads)."""
    steps = for_model(model) if isinstance(model, torch.nn.Module) else None
    if steps is not None:
        steps.stepper.adapt_threads(on)


def thread_counts(model) -> dict[int, int]:
    """{thread count: calls} the model's C++ step has run so far (step.cpp's Threads chooses the count per
    call, fewer than torch's where the host gives the job less than its cores); empty where it has none."""
    steps = getattr(model, "__dict__", {}).get("_quantspec_cpp_step")  # another runtime's job has no torch model
    if not steps:
        return {}
    flat = steps.stepper.thread_counts()
    return {int(flat[i]): int(flat[i + 1]) for i in range(0, len(flat), 2) if flat[i + 1]}


def for_model(model) -> CompiledSteps | None:
    """The C++ step for this model, or None where the Python step path stays (see the module's
    docstring); built once per model and kept on it."""
    steps = model.__dict__.get("_quantspec_cpp_step")
    if steps is None:
        lean = python_step.for_model(model)
        steps = False
        if lean is not None and modules.installed(model):
            try:
                steps = CompiledSteps(model, lean)
            except Unsupported:
                steps = False
        model.__dict__["_quantspec_cpp_step"] = steps
    return steps or None
