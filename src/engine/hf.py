"""The reference engine (engine=hf): transformers' `generate`, with a timestamp per new token.

A stopping criterion runs right after each new token is appended, so its clock reading is the end of
that step: the first reading closes prefill, the rest are decode steps.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import torch
from transformers import StoppingCriteria, StoppingCriteriaList

from src.engine.generation import Generation, Request


class _StepClock(StoppingCriteria):
    def __init__(self, prompt_tokens: int, stop: Callable[[list[int]], bool] | None) -> None:
        self.times: list[float] = []
        self.prompt_tokens, self.stop = prompt_tokens, stop

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor, **kwargs) -> torch.BoolTensor:
        self.times.append(time.perf_counter())
        done = bool(self.stop and self.stop(input_ids[0, self.prompt_tokens :].tolist()))
        return torch.full((input_ids.shape[0],), done, dtype=torch.bool, device=input_ids.device)


@torch.inference_mode()
def generate(model, request: Request) -> Generation:
    """One prompt through transformers' generate (the Request says what each field asks)."""
    input_ids, max_new_tokens, exact, sampling, pad_token_id, stop = request
    input_ids = input_ids.to(model.device)
    kwargs = dict(max_new_tokens=max_new_tokens, do_sample=sampling.do_sample, pad_token_id=pad_token_id)
    if sampling.do_sample:
        kwargs.update(temperature=sampling.temperature, top_p=sampling.top_p)
        torch.manual_seed(sampling.seed)
    else:
        # Models ship generation configs with sampling defaults; greedy must not inherit them.
        kwargs.update(temperature=None, top_p=None, top_k=None)
    if exact:
        kwargs["min_new_tokens"] = max_new_tokens
    clock = _StepClock(input_ids.shape[1], stop)
    attention_mask = torch.ones_like(input_ids)
    start = time.perf_counter()
    out = model.generate(
        input_ids, attention_mask=attention_mask, stopping_criteria=StoppingCriteriaList([clock]), **kwargs
    )
    end = time.perf_counter()
    new = out[0, input_ids.shape[1] :].tolist()
    return Generation(input_ids.shape[1], new, start, clock.times[: len(new)], end)
