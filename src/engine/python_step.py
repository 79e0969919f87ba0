"""A lean layer loop for decode steps and draft verification (engine.step_path=python, and cpp's where the
C++ step does not cover a model).

transformers' forward spends ~6 ms of Python per step on an 18-layer model (decorators, mask
builders, config lookups, ~300 module calls) before any arithmetic: on Gemma 3 270M with quantspec's
kernels that was as much as the matmuls. For a few new tokens whose context fits the attention
windows no mask is needed beyond causality, so this runs src.engine.layers' loop over the model's own
submodules' forwards (the same parameters, kernels and KV cache) in the order transformers does, and nothing
else. The linears that read one input (q/k/v, gate/up) take one kernel call where their formats allow
(src.engine.fused), and rotary positions take four tensor ops instead of nine.

It covers every family src.models.families describes; for anything else, or a context that reaches a sliding
window, the Decoder keeps transformers' forward. Its greedy output is tested equal to generate's on a tiny model
of each family.
"""

from __future__ import annotations

import torch
from torch.nn import functional as F

from src.engine import layers
from src.engine.fused import Projection
from src.kernels import modules
from src.models import families


class Steps(layers.Loop):
    """One forward over [1, k] new tokens into the model's DynamicCache."""

    def __init__(self, model, family: families.Family):
        super().__init__(model, family, norm=lambda m: m.forward, linears=Projection)
        # quantspec's attention where the model runs on quantspec's kernels: a query's output does not
        # depend on how many queries come together, so verifying a draft reproduces plain decoding exactly
        # (in bf16 too); SDPA otherwise.
        self.own_attention = modules.installed(model) and self.head_dim in (16, 32, 64, 128, 256)

    def covers(self, cached: int, new: int) -> bool:
        """Within the sliding window, causality is the only mask (transformers masks key j from query i
        when i - j >= window, so every position must be < window)."""
        return self.window is None or cached + new <= self.window

    def __call__(self, ids: torch.Tensor, cache, keep: int) -> torch.Tensor:
        k, past = ids.shape[1], cache.get_seq_length()
        pos = torch.arange(past, past + k, device=ids.device)
        h = self.embed(ids, pos)
        rope = {name: layers.signed(make(h, pos[None])) for name, make in self.tables.items()}
        step = (cache, rope, self._mask(past, k, ids.device))
        for i in range(len(self.layers)):
            h = self.layer(i, h, step)
        return self.finish(h[:, -keep:])[0]

    def rope(self, i, q, key, step):
        tables = step[1]
        return layers.rotated(q, key, *tables[self.table[i]]) if tables else (q, key)

    def attend(self, i, q, key, value, step) -> torch.Tensor:
        """Append this step's keys and values to the cache, attend over it: -> [1, k, heads * head_dim]."""
        cache, _, mask = step
        key, value = cache.update(key, value, i)
        if self.own_attention:
            out = torch.ops.quantspec.decode_attention(q, key, value, self.scaling)
        else:
            out = F.scaled_dot_product_attention(q, key, value, attn_mask=mask, scale=self.scaling, enable_gqa=True)
        return out.transpose(1, 2).reshape(1, q.shape[2], -1)

    @staticmethod
    def _mask(past: int, k: int, device) -> torch.Tensor | None:
        # transformers' causal mask for k new tokens: query i sees keys 0 .. past + i
        return (
            None
            if k == 1
            else (
                torch.arange(past + k, device=device)[None, :] <= torch.arange(past, past + k, device=device)[:, None]
            )
        )


def for_model(model) -> Steps | None:
    """The lean loop for this model, or None where transformers' forward stays the only path. Built once
    per model and kept on it: building fuses linears (src.engine.fused), a copy of their weights."""
    steps = model.__dict__.get("_quantspec_steps")
    if steps is None:
        family = families.of(model)
        steps = Steps(model, family) if family else False
        model.__dict__["_quantspec_steps"] = steps
    return steps or None
