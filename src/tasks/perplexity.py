"""Perplexity over non-overlapping windows of the corpus: quality, measured beside speed."""

from __future__ import annotations

import math
import time

import torch
import torch.nn.functional as F

from src.tasks.common import TaskInputs, TaskResult, bos_prefix


def sequence_nll(logits: torch.Tensor, ids: torch.Tensor) -> float:
    """Summed negative log-likelihood of ids[1:] from the logits of every position of ids (the last
    position's, which predicts past the window, unused), in the logits' float precision."""
    return F.cross_entropy(logits[:-1], ids[1:].to(logits.device), reduction="sum").item()


@torch.inference_mode()
def window_nll(model, ids: torch.Tensor) -> float:
    """Summed negative log-likelihood of ids[1:] given their prefixes, in float32."""
    return sequence_nll(model(input_ids=ids[None].to(model.device)).logits[0].float(), ids)


def run(inputs: TaskInputs) -> TaskResult:
    task, tok = inputs.task, inputs.tokenizer
    ids = tok(inputs.corpus(), add_special_tokens=False).input_ids
    # Each window starts with BOS where the model expects one, as a prompt would.
    prefix = bos_prefix(tok)
    body = task.window - len(prefix)
    available = len(ids) // body
    if available < 1:
        raise ValueError(f"the corpus has {len(ids)} tokens, fewer than one window of {task.window}")
    count = min(task.windows, available)
    notes = [f"only {available} windows of {task.window} tokens in the corpus; used {count}"] if count < task.windows else []
    total, tokens, per_window = 0.0, 0, []
    # an engine that runs weights of its own (another runtime) scores them itself, from its own logits
    nll_of = getattr(inputs.generate, "window_nll", None) or (lambda chunk: window_nll(inputs.model, chunk))
    start = time.perf_counter()
    for i in range(count):
        chunk = torch.tensor(prefix + ids[i * body:(i + 1) * body])
        nll = nll_of(chunk)
        per_window.append(nll / (len(chunk) - 1))
        total, tokens = total + nll, tokens + len(chunk) - 1
    summary = {"perplexity": math.exp(total / tokens), "perplexity_window": float(task.window),
               "perplexity_windows": float(count), "perplexity_tokens": float(tokens),
               "perplexity_eval_s": time.perf_counter() - start}
    return TaskResult([], summary, series={"window/nll": per_window}, notes=notes)
