"""Perplexity over non-overlapping windows of the corpus, and how far the job's model departs there from its
reference (task.reference): KL divergence, top-1 agreement and Δ perplexity, each with its uncertainty."""

from __future__ import annotations

import time

import numpy as np
import torch

from src.common.metrics import csv_text
from src.data.corpus import bos_prefix, leading_ids
from src.quality import divergence, stats
from src.tasks.timed import TaskInputs, TaskResult


def windows(tokenizer, corpus: str, window: int, count: int) -> tuple[list[torch.Tensor], list[str]]:
    """Up to `count` non-overlapping windows of `window` tokens, each starting with BOS where the model
    expects one (as a prompt would); and what the user must be told where the corpus had fewer."""
    prefix = bos_prefix(tokenizer)
    body = window - len(prefix)
    ids = leading_ids(tokenizer, corpus, body * count)  # only the windows scored, not the whole corpus
    available = len(ids) // body
    if available < 1:
        raise ValueError(f"the corpus has {len(ids)} tokens, fewer than one window of {window}")
    used = min(count, available)
    notes = [f"only {available} windows of {window} tokens in the corpus; used {used}"] if used < count else []
    return [torch.tensor(prefix + ids[i * body : (i + 1) * body]) for i in range(used)], notes


def run(inputs: TaskInputs) -> TaskResult:
    task = inputs.task
    chunks, notes = windows(inputs.tokenizer, inputs.corpus(), task.window, task.windows)
    refs, where = inputs.reference.windows(chunks) if inputs.reference else (None, None)
    start = time.perf_counter()
    scores = [
        inputs.score(c, None if refs is None else r.indices) for c, r in zip(chunks, refs or [None] * len(chunks))
    ]
    seconds = time.perf_counter() - start
    nll = np.concatenate([-s.target_logp.double().numpy() for s in scores])
    offsets = np.cumsum([0] + [len(s.target_logp) for s in scores])  # where each window's tokens start in nll
    per_window = lambda values: [float(values[a:b].mean()) for a, b in zip(offsets[:-1], offsets[1:])]  # noqa: E731
    ppl, ppl_se = stats.perplexity_se(nll)
    summary = {
        "perplexity": ppl,
        "perplexity_se": ppl_se,
        "perplexity_window": float(task.window),
        "perplexity_windows": float(len(chunks)),
        "perplexity_tokens": float(nll.size),
        "perplexity_eval_s": seconds,
    }
    series = {"window/nll": per_window(nll)}
    columns = {"window": np.concatenate([np.full(len(s.target_logp), i) for i, s in enumerate(scores, 1)]), "nll": nll}
    tags: dict[str, str] = {}
    if refs is not None:
        kl, tail = zip(*(divergence.kl_per_token(r, s) for r, s in zip(refs, scores)))
        kl, tail = torch.cat(kl).numpy(), torch.cat(tail).numpy()
        same = torch.cat([s.top1 == r.top1 for r, s in zip(refs, scores)]).numpy()
        ref_nll = np.concatenate([-r.target_logp.double().numpy() for r in refs])
        summary.update(divergence.window_summary(kl, same, nll, ref_nll))
        # MLPerf's rule, for perplexity: the reference's over the job's (1 for as good, below for worse)
        summary["quality_ratio"] = summary["reference_perplexity"] / ppl
        summary["kl_tail_mass"] = float(tail.mean())
        summary["reference_top_k"] = float(refs[0].indices.shape[-1])
        series["window/kl_mean"] = per_window(kl)
        columns.update({"reference_nll": ref_nll, "kl": kl, "same_top1": same.astype(int)})
        tags = {"reference": inputs.reference.describe(refs[0].vocab), "reference_cache": str(where)}
    table = [list(columns), *zip(*(c.tolist() for c in columns.values()))]
    return TaskResult([], summary, artifacts={"per_token.csv": csv_text(table)}, series=series, notes=notes, tags=tags)
