"""Calibration: token windows cut from the corpus (what the layers' forwards meet them with: src.quant.stream)."""

from __future__ import annotations

import hashlib

import torch

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
