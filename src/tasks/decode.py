"""The seeds' decode task: fixed prompts, their responses kept beside the timings, and (task.reference) how far
the model's choices depart from the reference's on the same prompts."""

from __future__ import annotations

import json

import torch

from src.data import prompts as prompt_file
from src.data.corpus import prompts, prompts_input
from src.quality import divergence
from src.tasks.timed import Example, TaskInputs, TaskResult, limit, measure, result


def diverging(inputs: TaskInputs, examples: list[Example], new_tokens: int) -> tuple[dict, dict, dict]:
    """Teacher-forced on the reference's greedy continuation of each prompt (src.quality.divergence): the
    summary, per-example series and the reference's continuations (an artifact beside the responses)."""
    references = inputs.reference.continuations([ex.prompt_ids for ex in examples], new_tokens)
    first, share = [], []
    for ex, tokens in zip(examples, references):
        prompt = ex.prompt_ids[0]
        score = inputs.score(torch.cat([prompt, torch.tensor(tokens, dtype=prompt.dtype)]), None)
        f, s = divergence.generation_divergence(score.top1[len(prompt) - 1 :], tokens)
        first.append(f)
        share.append(s)
    series = {"first_divergent_token": [float(f) for f in first], "divergent_share": share}
    return divergence.generation_summary(first, share), series, references


def _examples(inputs: TaskInputs, new_tokens: int) -> tuple[list[Example], list[str]]:
    """The seeds' prompts, or the user's (dataset=jsonl: a chat through the tokenizer's chat template); and what
    the job must say of them."""
    tok = inputs.tokenizer
    if inputs.prompts is None:
        texts = limit(prompts(inputs.code_model), inputs.task.limit)
        inputs.record_input(prompts_input(inputs.code_model, texts))
        return [Example(tok(t, return_tensors="pt").input_ids, new_tokens, t) for t in texts], []
    chosen = limit(inputs.prompts, inputs.task.limit)
    encoded = [prompt_file.encode(tok, p, inputs.max_context) for p in chosen]
    inputs.record_input(inputs.prompts_input([tok.decode(ids) for ids in encoded]))
    examples = [Example(torch.tensor([ids]), new_tokens, p.label) for p, ids in zip(chosen, encoded)]
    chats = sum(1 for p in chosen if p.messages)
    notes = []
    if chats and not prompt_file.templated(tok):
        notes.append(f"the tokenizer has no chat template: {chats} chat prompt(s) ran as their turns' text joined")
    return examples, notes


def run(inputs: TaskInputs) -> TaskResult:
    new_tokens = inputs.task.new_tokens(inputs.code_model)
    tok = inputs.tokenizer
    examples, notes = _examples(inputs, new_tokens)
    measured = measure(inputs, examples, exact=inputs.task.exact_new_tokens)
    responses = [
        {"example": i, "prompt": ex.label, "response": tok.decode(ids, skip_special_tokens=True)}
        for i, (ex, ids) in enumerate(zip(examples, measured.outputs), start=1)
    ]
    tags = {}
    if inputs.reference is not None:  # after the timing: the scoring passes are not timed
        summary, series, references = diverging(inputs, examples, new_tokens)
        measured.summary.update(summary)
        measured.series.update(series)
        for response, tokens in zip(responses, references):
            response["reference"] = tok.decode(tokens, skip_special_tokens=True)
        tags = {"reference": inputs.reference.describe()}
    text = "\n".join(json.dumps(r, ensure_ascii=False) for r in responses) + "\n"
    out = result(measured, artifacts={"responses.jsonl": text}, notes=notes)
    out.tags.update(tags)
    return out
