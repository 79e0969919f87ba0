"""What every timed task shares: its inputs, its result, and the measured loop over examples."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Callable

import torch

from src.config import TaskConfig
from src.engine import Sampling
from src.metrics import Row, summarize, timing_row
from src.progress import progress

log = logging.getLogger(__name__)


@dataclass
class TaskInputs:
    model: torch.nn.Module
    tokenizer: object
    task: TaskConfig
    code_model: bool
    sampling: Sampling
    max_context: int
    corpus: Callable[[], str]   # lazy: the decode task never reads the dataset
    generate: Callable          # the engine: one of src.engine.ENGINES


@dataclass
class Example:
    prompt_ids: torch.Tensor    # shape (1, prompt_tokens)
    max_new_tokens: int
    label: str


@dataclass
class TaskResult:
    rows: list[Row]
    summary: dict[str, float]
    artifacts: dict[str, str] = field(default_factory=dict)   # file name -> text
    series: dict[str, list[float]] = field(default_factory=dict)  # metric -> one value per step
    notes: list[str] = field(default_factory=list)            # things the user must be told


def bos_prefix(tokenizer) -> list[int]:
    """[BOS] when the tokenizer puts one before a prompt, else []: hand-cut token windows start the same way."""
    bos = tokenizer.bos_token_id
    return [bos] if bos is not None and tokenizer("a").input_ids[:1] == [bos] else []


def limit(examples: list, n: int | None) -> list:
    return examples if n is None else examples[:n]


def measure(inputs: TaskInputs, examples: list[Example], exact: bool) -> tuple[list[Row], list[list[int]]]:
    """Warm up apart from measurement, then time each example. Returns rows and the new token ids."""
    if not examples:
        raise ValueError(f"task {inputs.task.name} has no examples to run")
    pad = inputs.tokenizer.pad_token_id
    for _ in range(inputs.task.warmup):
        first = examples[0]
        inputs.generate(inputs.model, first.prompt_ids, min(first.max_new_tokens, 8), exact, inputs.sampling, pad)
    rows, outputs = [], []
    for number, ex in progress(enumerate(examples, start=1), inputs.task.name, total=len(examples)):
        # Shared machines drift: with repeats, the run of median total time stands for the example.
        runs = sorted((inputs.generate(inputs.model, ex.prompt_ids, ex.max_new_tokens, exact, inputs.sampling, pad)
                       for _ in range(inputs.task.repeats)), key=lambda g: g.end - g.start)
        gen = runs[len(runs) // 2]
        row = timing_row(number, gen.prompt_tokens, gen.start, gen.token_times[0], gen.end, gen.new_tokens)
        log.info("example %d/%d: %d prompt tokens, %d new, %.1f ms/token", number, len(examples),
                 row.prompt_tokens, row.new_tokens, row.time_per_token_ms)
        rows.append(row)
        outputs.append(gen.new_token_ids)
    return rows, outputs


def result(rows: list[Row], **kwargs) -> TaskResult:
    return TaskResult(rows, summarize(rows), **kwargs)
