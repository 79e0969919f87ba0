"""One model's scoring of one token window, reduced to what every quality figure needs.

Position t of a window predicts ids[t+1]. Shipping a 262144-token vocabulary's logits for each of 512
positions (512 MB a window) between processes, or caching them, is out of the question, so a model's
logits are reduced where they are computed, by the same function for torch models and other runtimes.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F


@dataclass
class WindowScore:
    """What a model said about each position of a window (n tokens: n-1 predictions)."""

    target_logp: torch.Tensor  # (n-1,) float32: log-prob of the token that came next
    top1: torch.Tensor  # (n-1,) int64: the model's most likely next token
    logp_at: torch.Tensor | None  # (n-1, k) float32: log-probs at the reference's top-k tokens


@dataclass
class ReferenceWindow:
    """The reference's view of a window: its k most likely next tokens at each position, most likely first."""

    indices: torch.Tensor  # (n-1, k) int64
    logp: torch.Tensor  # (n-1, k) float32, descending
    target_logp: torch.Tensor  # (n-1,) float32
    vocab: int  # the full vocabulary: k == vocab means nothing was cut

    @property
    def top1(self) -> torch.Tensor:
        return self.indices[:, 0]


def _log_probs(logits: torch.Tensor) -> torch.Tensor:
    return F.log_softmax(logits[:-1].float(), dim=-1)


def score_logits(logits: torch.Tensor, ids: torch.Tensor, indices: torch.Tensor | None = None) -> WindowScore:
    """logits: (n, vocab) for the n tokens of ids; indices: the reference's top-k per position, or None."""
    logp = _log_probs(logits)
    target = ids[1:].to(logp.device).long()
    at = logp.gather(1, indices.to(logp.device).long()).cpu() if indices is not None else None
    return WindowScore(logp.gather(1, target[:, None])[:, 0].cpu(), logp.argmax(-1).cpu(), at)


def reference_window(logits: torch.Tensor, ids: torch.Tensor, k: int) -> ReferenceWindow:
    """The reference's top-k (k clipped to the vocabulary: all of it is kept where it is small)."""
    logp = _log_probs(logits)
    k = min(k, logp.shape[-1])
    values, indices = logp.topk(k, dim=-1)  # sorted, most likely first
    target = logp.gather(1, ids[1:].to(logp.device).long()[:, None])[:, 0]
    return ReferenceWindow(indices.cpu(), values.cpu(), target.cpu(), logp.shape[-1])


def torch_scorer(model):
    """score(ids, indices) for a torch causal LM: one forward over the window."""

    @torch.inference_mode()
    def score(ids: torch.Tensor, indices: torch.Tensor | None = None) -> WindowScore:
        logits = model(input_ids=ids[None].to(model.device)).logits[0]
        return score_logits(logits, ids, indices)

    return score
