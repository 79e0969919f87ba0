"""The seeds' decode task: fixed prompts, their responses kept beside the timings."""

from __future__ import annotations

import json

from src.assembly.corpus import SEED_PROMPTS, code_prompts, prompts_input
from src.tasks.common import Example, TaskInputs, TaskResult, limit, measure, result


def prompts(code_model: bool) -> list[str]:
    return code_prompts() if code_model else list(SEED_PROMPTS)


def run(inputs: TaskInputs) -> TaskResult:
    new_tokens = inputs.task.new_tokens(inputs.code_model)
    texts = limit(prompts(inputs.code_model), inputs.task.limit)
    inputs.record_input(prompts_input(inputs.code_model, texts))
    tok = inputs.tokenizer
    examples = [Example(tok(t, return_tensors="pt").input_ids, new_tokens, t) for t in texts]
    measured = measure(inputs, examples, exact=inputs.task.exact_new_tokens)
    responses = [{"example": i, "prompt": ex.label, "response": tok.decode(ids, skip_special_tokens=True)}
                 for i, (ex, ids) in enumerate(zip(examples, measured.outputs), start=1)]
    text = "\n".join(json.dumps(r, ensure_ascii=False) for r in responses) + "\n"
    return result(measured, artifacts={"responses.jsonl": text})
