"""A draft's output head cut down to the tokens a corpus uses most (draft.vocab).

Gemma 3's head is 262144 x 640: on the CPU it is a third of a draft step, while code and prose use a
few thousand of those tokens. The draft scores only the kept ones (the rest get -inf, so it never
proposes them); the target still checks every proposal against its full vocabulary, so greedy output
is unchanged and only acceptance can drop (when the target's token is not among the kept).
"""

from __future__ import annotations

from collections import Counter

import torch
from torch import nn


def frequent_tokens(tokenizer, corpus: str, n: int) -> torch.Tensor:
    """The n most frequent token ids of the corpus's second half (the half calibration reads, never
    the one perplexity or benchmark prompts come from), with the special tokens; sorted."""
    ids = tokenizer(corpus, add_special_tokens=False).input_ids
    counts = Counter(ids[len(ids) // 2 :])
    keep = {t for t, _ in counts.most_common(n)}
    keep |= {t for t in (tokenizer.bos_token_id, tokenizer.eos_token_id, tokenizer.pad_token_id) if t is not None}
    return torch.tensor(sorted(keep), dtype=torch.long)


def _rows(head: nn.Module, ids: torch.Tensor) -> nn.Module:
    """The head's output rows `ids`, as a module of the same kind."""
    if hasattr(head, "select_rows"):  # quantized runtime modules and kernel modules: same kernels
        return head.select_rows(ids)
    weight = getattr(head, "weight", None)
    if weight is None or weight.dim() != 2:
        raise ValueError(f"draft.vocab cannot cut a {type(head).__name__} head; use draft.vocab=null")
    cut = nn.Linear(weight.shape[1], len(ids), bias=head.bias is not None, dtype=weight.dtype, device=weight.device)
    with torch.no_grad():
        cut.weight.copy_(weight[ids])
        if head.bias is not None:
            cut.bias.copy_(head.bias[ids])
    return cut


class SubsetHead(nn.Module):
    """Logits over the full vocabulary, computed for `ids` only; -inf everywhere else.

    `focus(prompt)` adds a prompt's own tokens to the kept ones (code repeats its identifiers, which a
    corpus cannot know): the rows are cut again from the full head, once per generation.
    """

    def __init__(self, head: nn.Module, ids: torch.Tensor):
        super().__init__()
        self.full, self.base, self.vocab_size = head, ids.to(torch.long), head.out_features
        self._cut(self.base)

    def _cut(self, ids: torch.Tensor) -> None:
        # Cut from the full head as it is now: rows of a head swapped for a kernel module take its kernels.
        self.head = _rows(self.full, ids)
        self.ids = ids

    def focus(self, prompt: list[int]) -> None:
        ids = torch.unique(torch.cat([self.base, torch.tensor(prompt, dtype=torch.long)]))
        if not torch.equal(ids, self.ids):
            self._cut(ids)

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        kept = self.head(h)
        out = kept.new_full((*kept.shape[:-1], self.vocab_size), float("-inf"))
        return out.index_copy_(-1, self.ids, kept)


def cut_head(model: nn.Module, ids: torch.Tensor) -> int:
    """Replace the model's output head in place; returns how many tokens it keeps."""
    head = model.get_output_embeddings()
    model.set_output_embeddings(SubsetHead(head, ids.to(next(model.parameters()).device)))
    return len(ids)
