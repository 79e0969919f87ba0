"""Prompts of fixed token lengths cut from the corpus, each generating exactly max_new_tokens."""

from __future__ import annotations

import torch

from src.data.corpus import bos_prefix, leading_ids
from src.tasks.timed import Example, TaskInputs, TaskResult, limit, measure, result


def cut_prompts(tokenizer, corpus: str, lengths: list[int]) -> list[torch.Tensor]:
    """One prompt per length, counted like a tokenized prompt (with the BOS the tokenizer adds)."""
    prefix = bos_prefix(tokenizer)
    ids = leading_ids(tokenizer, corpus, max(lengths, default=0) - len(prefix))  # only what the longest needs
    prompts = []
    for n in lengths:
        body = ids[: n - len(prefix)]
        if len(body) < n - len(prefix):
            raise ValueError(
                f"the corpus has {len(ids)} tokens, too few for a {n}-token prompt; "
                f"use a larger dataset or shorter task.prompt_lengths"
            )
        prompts.append(torch.tensor([prefix + body]))
    return prompts


def run(inputs: TaskInputs) -> TaskResult:
    task = inputs.task
    new_tokens = task.new_tokens(inputs.code_model)
    fits = [n for n in task.prompt_lengths if n + new_tokens <= inputs.max_context]
    notes = (
        [
            f"prompt lengths {[n for n in task.prompt_lengths if n not in fits]} dropped: with {new_tokens} new "
            f"tokens they exceed the model's context of {inputs.max_context}"
        ]
        if len(fits) < len(task.prompt_lengths)
        else []
    )
    fits = limit(fits, task.limit)
    if not fits:
        raise ValueError(f"no prompt length of task {task.name} fits the model's context of {inputs.max_context}")
    prompts = cut_prompts(inputs.tokenizer, inputs.corpus(), fits)
    examples = [Example(p, new_tokens, f"{n} tokens") for p, n in zip(prompts, fits)]
    return result(measure(inputs, examples, exact=task.exact_new_tokens), notes=notes)
