"""Generation with a timestamp per new token. Pure: models and tensors in, tokens and timings out.

This is the reference engine over transformers' `generate`. A stopping criterion runs right after each
new token is appended, so its clock reading is the end of that step: the first reading closes prefill,
the rest are decode steps. Nothing else is added to the measured path.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch
from transformers import StoppingCriteria, StoppingCriteriaList


@dataclass(frozen=True)
class Sampling:
    do_sample: bool = False
    temperature: float = 1.0
    top_p: float = 1.0
    seed: int = 0


@dataclass
class Generation:
    prompt_tokens: int
    new_token_ids: list[int]
    start: float               # perf_counter at the call
    token_times: list[float]   # perf_counter when each new token existed
    end: float                 # perf_counter when generate returned

    @property
    def new_tokens(self) -> int:
        return len(self.new_token_ids)


class _StepClock(StoppingCriteria):
    def __init__(self) -> None:
        self.times: list[float] = []

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor, **kwargs) -> torch.BoolTensor:
        self.times.append(time.perf_counter())
        return torch.zeros(input_ids.shape[0], dtype=torch.bool, device=input_ids.device)


@torch.inference_mode()
def generate(model, input_ids: torch.Tensor, max_new_tokens: int, exact: bool, sampling: Sampling,
             pad_token_id: int | None) -> Generation:
    """One prompt (batch of 1). `exact` forbids stopping at end-of-sequence, so benchmark runs compare."""
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
    clock = _StepClock()
    attention_mask = torch.ones_like(input_ids)
    start = time.perf_counter()
    out = model.generate(input_ids, attention_mask=attention_mask, stopping_criteria=StoppingCriteriaList([clock]),
                         **kwargs)
    end = time.perf_counter()
    new = out[0, input_ids.shape[1]:].tolist()
    return Generation(input_ids.shape[1], new, start, clock.times[:len(new)], end)
