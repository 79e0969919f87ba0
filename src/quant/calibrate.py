"""Calibration: token windows cut from the corpus, and what hooks see at the linears' inputs.

Kept apart from the runtime modules: this runs once per cache key, in float32, on the float model.
"""

from __future__ import annotations

import hashlib

import torch
from torch import nn

from src.common.progress import progress
from src.quant import gptq

CALIB_MAX_CHARS = 4 << 20  # characters of a corpus tokenized for calibration (a 63 MB one had been tokenized whole)


def calibration_ids(tokenizer, corpus: str, samples: int, seq_len: int) -> torch.Tensor:
    """[samples, seq_len] windows spread evenly over the corpus's second half (deterministic, so the
    cache key is). Perplexity reads from the start: calibration never sees the evaluated text. Of a corpus over
    CALIB_MAX_CHARS characters only that much of its second half is tokenized, from its middle on."""
    sliced = len(corpus) > CALIB_MAX_CHARS
    if sliced:  # a large corpus: a slice of its second half, from a line's start to a line's end
        start = corpus.find("\n", len(corpus) // 2) + 1 or len(corpus) // 2
        end = corpus.rfind("\n", start, start + CALIB_MAX_CHARS) + 1 or start + CALIB_MAX_CHARS
        corpus = corpus[start:end]
    ids = torch.tensor(tokenizer(corpus, add_special_tokens=False).input_ids)
    half = 0 if sliced else len(ids) // 2  # a slice lies in the second half already
    if len(ids) - half < seq_len:
        raise ValueError(
            f"the calibration corpus's second half has {len(ids) - half} tokens, fewer than one "
            f"window of {seq_len}; lower precision.calib_seq_len or use a larger dataset"
        )
    starts = torch.linspace(half, len(ids) - seq_len, samples).long()
    return torch.stack([ids[s : s + seq_len] for s in starts])


def ids_hash(ids: torch.Tensor) -> str:
    return hashlib.sha256(ids.numpy().tobytes()).hexdigest()


@torch.inference_mode()
def _observe_inputs(
    model: nn.Module, linears: dict[str, nn.Module], batches: torch.Tensor, observe, output=None
) -> None:
    """Run the decoder stack over the batches, calling observe(name, x) with each named linear's input
    as rows [tokens, features], and output(x) with the stack's output (the head's input) where given. The
    head itself (a third of Gemma 3's weights) is not run."""

    def hook(name):
        return lambda _module, args: observe(name, args[0].detach().reshape(-1, args[0].shape[-1]))

    handles = [m.register_forward_pre_hook(hook(n)) for n, m in linears.items()]
    try:
        for row in progress(batches, "calibration"):
            hidden = model.model(input_ids=row[None]).last_hidden_state
            if output is not None:
                output(hidden.reshape(-1, hidden.shape[-1]))
    finally:
        for h in handles:
            h.remove()


def input_absmax(model: nn.Module, linears: dict[str, nn.Module], batches: torch.Tensor) -> dict[str, torch.Tensor]:
    """Per-input-channel max |x| over every calibration token, at each named linear's input."""
    stats: dict[str, torch.Tensor] = {}

    def observe(name, x):
        x = x.abs().amax(dim=0).float()
        stats[name] = torch.maximum(stats[name], x) if name in stats else x

    _observe_inputs(model, linears, batches, observe)
    return stats


def capture_inputs(
    model: nn.Module, linears: dict[str, nn.Module], batches: torch.Tensor, max_tokens: int, seed: int = 0
) -> dict[str, torch.Tensor]:
    """A fixed random subset of `max_tokens` input rows at each named linear (AWQ's search data), in the
    model's dtype."""
    keep = torch.randperm(batches.numel(), generator=torch.Generator().manual_seed(seed))[:max_tokens].sort().values
    seen: dict[str, list[torch.Tensor]] = {n: [] for n in linears}
    offsets = {n: 0 for n in linears}

    def observe(name, x):
        lo = offsets[name]
        offsets[name] += x.shape[0]
        # kept in the model's dtype (a bf16 7B's inputs at 2048 tokens are 3 GB, not 6); callers upcast
        seen[name].append(x[keep[(keep >= lo) & (keep < lo + x.shape[0])] - lo].clone())

    _observe_inputs(model, linears, batches, observe)
    return {n: torch.cat(xs) for n, xs in seen.items()}


def input_grams(
    model: nn.Module, linears: dict[str, nn.Module], batches: torch.Tensor, head: bool = False
) -> dict[str, torch.Tensor]:
    """X^T X (float64) over every calibration token at each named linear's input, and where `head`, at the
    output head's under the name "head" (GPTQ's H, src.quant.gptq)."""
    grams: dict[str, torch.Tensor] = {}

    def observe(name, x):
        g = gptq.gram(x)
        grams[name] = grams[name] + g if name in grams else g

    _observe_inputs(model, linears, batches, observe, (lambda x: observe("head", x)) if head else None)
    return grams
