"""What every timed task shares: its inputs, its result, and the measured loop over examples."""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import torch

from src.common import latency
from src.common.energy import Energy
from src.common.metrics import Row, summarize, timing_row
from src.common.progress import progress
from src.common.sysmetrics import OthersCpu
from src.engine import Sampling
from src.engine.generation import Request
from src.tasks import drafting
from src.tasks.kinds import TaskConfig

log = logging.getLogger(__name__)


BANDWIDTH = "bandwidth_gbs"  # the series of each example's bandwidth probe


def _gpu_uuid(model) -> str | None:
    """The UUID of the CUDA device the model's weights are on (its energy is read by NVML), or None."""
    weight = next(model.parameters(), None) if isinstance(model, torch.nn.Module) else None
    if weight is None or weight.device.type != "cuda":
        return None
    return str(torch.cuda.get_device_properties(weight.device).uuid)


@dataclass
class TaskInputs:
    model: torch.nn.Module
    tokenizer: object
    task: TaskConfig
    code_model: bool
    sampling: Sampling
    max_context: int
    corpus: Callable[[], str]  # lazy: read only by a task that cuts its text (a decode never does)
    generate: Callable  # the engine: src.engine.engine_for(...)
    baseline: Callable | None = None  # with a draft: the same engine without it, timed beside it
    record_input: Callable = lambda text: None  # a task reading text the corpus did not give it says so
    on_row: Callable = lambda row, total: None  # each example's row as it is measured (kept if the job stops)
    # quality: the job's model scoring a window, score(ids, reference top-k or None) -> WindowScore
    # (src.quality.scoring), and the reference it is measured against (None: task.reference=none, or random weights)
    score: Callable | None = None
    reference: object | None = None  # src.quality.reference.Reference
    # the host's read bandwidth in GB/s, probed now (src.engine.roofline.Probe), after each timed example:
    # its roofline is set against the memory that example met. None where no roofline applies.
    bandwidth: Callable[[], float] | None = None
    prompts: list | None = None  # dataset=jsonl: the user's prompts (src.data.prompts.Prompt) in place of the seeds'
    prompts_input: Callable | None = None  # texts -> the TextInput that records them (dataset=jsonl)
    cache_dir: Path | None = None  # the cache (task=serve's load generator and llama-server live there)
    gguf: Callable[[], Path] | None = None  # the model's GGUF file (task.server=llama-server serves it)
    checkpoint: Callable[[], str] | None = None  # its float weights as a transformers checkpoint (task.server=vllm)
    # (text, name): an artifact kept at once, whether the task then fails or not (task=serve's load generator log)
    keep_text: Callable[[str, str], None] = lambda text, name: None


@dataclass
class Example:
    prompt_ids: torch.Tensor  # shape (1, prompt_tokens)
    max_new_tokens: int
    label: str
    stop: Callable[[list[int]], bool] | None = None  # new tokens so far -> end here (stop sequences)
    sample: int = 0  # the n-th sample of one prompt: drawn with sampling.seed + n


@dataclass
class TaskResult:
    rows: list[Row]
    summary: dict[str, float]
    artifacts: dict[str, str] = field(default_factory=dict)  # file name -> text
    series: dict[str, list[float]] = field(default_factory=dict)  # metric -> one value per step
    notes: list[str] = field(default_factory=list)  # things the user must be told
    tags: dict[str, str] = field(default_factory=dict)  # what the run is tagged with (its reference)


def limit(examples: list, n: int | None) -> list:
    return examples if n is None else examples[:n]


@dataclass
class Measured:
    rows: list[Row]
    outputs: list[list[int]]  # each example's new token ids
    baseline_outputs: list[list[int]] = field(default_factory=list)  # with a draft: the same without it
    series: dict[str, list[float]] = field(default_factory=dict)  # per example (draft metrics)
    summary: dict[str, float] = field(default_factory=dict)  # over all examples (draft metrics)
    token_times: list[latency.TokenTimes] = field(default_factory=list)  # each example's, its kept run's
    tags: dict[str, str] = field(default_factory=dict)  # what the run is tagged with (its energy's source)


def _row(number: int, gen) -> Row:
    return timing_row(number, gen.prompt_tokens, gen.start, gen.token_times[0], gen.end, gen.new_tokens)


def _median_run(runs: list):
    # Shared machines drift: with repeats, the run of median total time stands for the example.
    return sorted(runs, key=lambda g: g.end - g.start)[len(runs) // 2]


def measure(inputs: TaskInputs, examples: list[Example], exact: bool) -> Measured:
    """Warm up apart from measurement, then time each example; with a draft, also without it, in turns."""
    if not examples:
        raise ValueError(f"task {inputs.task.name} has no examples to run")
    pad = inputs.tokenizer.pad_token_id
    engines = [inputs.generate] + ([inputs.baseline] if inputs.baseline else [])
    for _ in range(inputs.task.warmup):
        first = examples[0]
        for engine in engines:
            engine(inputs.model, Request(first.prompt_ids, min(first.max_new_tokens, 8), exact, inputs.sampling, pad))
    out = Measured([], [])
    drafted = _Drafted()
    others = OthersCpu()  # what other processes took while we timed: a busy host is flagged, not hidden
    generated = 0
    with Energy(gpu=_gpu_uuid(inputs.model)) as energy:  # the host's energy, where it says (src.common.energy)
        for number, ex in progress(enumerate(examples, start=1), inputs.task.name, total=len(examples)):
            with others:
                runs = _timed(inputs, engines, ex, exact, pad)
            generated += sum(g.new_tokens for engine_runs in runs for g in engine_runs)
            if inputs.bandwidth is not None:  # outside `others`: the probe's own threads are not another's load
                out.series.setdefault(BANDWIDTH, []).append(inputs.bandwidth())
            gen = _median_run(runs[0])
            row = _row(number, gen)
            inputs.on_row(row, len(examples))  # journaled before it is said: "example n/" means it is kept
            log.info(
                "example %d/%d: %d prompt tokens, %d new, %.1f ms/token",
                number,
                len(examples),
                row.prompt_tokens,
                row.new_tokens,
                row.time_per_token_ms,
            )
            out.rows.append(row)
            out.outputs.append(gen.new_token_ids)
            out.token_times.append(latency.token_times(number, gen.start, gen.token_times))
            if gen.spec is not None:
                drafted.add(out, number, gen, row, _median_run(runs[1]) if inputs.baseline else None)
    if drafted.specs:
        out.summary = drafted.summary(out, greedy=not inputs.sampling.do_sample)
    if others.cores() is not None:
        out.summary["others_cpu_cores"] = others.cores()
    out.summary.update(energy.figures(generated))
    out.tags["energy"] = energy.why
    return out


def _timed(inputs: TaskInputs, engines: list, ex: Example, exact: bool, pad) -> list[list]:
    """Each engine's runs of one example, in turns: at least `repeats`, and more until min_time_s has passed
    (a timing sized by time holds on any host and any load, where a count tuned on one host can take
    minutes on another)."""
    sampling = inputs.sampling
    if ex.sample:  # the n-th sample of an example: its own seed
        sampling = dataclasses.replace(sampling, seed=sampling.seed + ex.sample)
    runs: list[list] = [[] for _ in engines]
    deadline = time.perf_counter() + inputs.task.min_time_s
    while len(runs[0]) < inputs.task.repeats or time.perf_counter() < deadline:
        for i, engine in enumerate(engines):
            runs[i].append(
                engine(inputs.model, Request(ex.prompt_ids, ex.max_new_tokens, exact, sampling, pad, stop=ex.stop))
            )
    return runs


@dataclass
class _Drafted:
    """What a drafted job's examples said of the draft: its stats, and the same prompts without it."""

    specs: list = field(default_factory=list)
    baseline_ms: list[float] = field(default_factory=list)
    identical: list[bool] = field(default_factory=list)

    def add(self, out: Measured, number: int, gen, row: Row, plain) -> None:
        base = _row(number, plain) if plain else None
        series = drafting.example_series(gen.spec, row.time_per_token_ms, base and base.time_per_token_ms)
        for key, value in series.items():
            out.series.setdefault(key, []).append(value)
        self.specs.append(gen.spec)
        if base is not None:
            out.baseline_outputs.append(plain.new_token_ids)
            self.baseline_ms.append(base.time_per_token_ms)
            self.identical.append(gen.new_token_ids == plain.new_token_ids)

    def summary(self, out: Measured, greedy: bool) -> dict:
        return drafting.summary(
            self.specs,
            [r.time_per_token_ms for r in out.rows],
            self.baseline_ms or None,
            self.identical if self.identical and greedy else None,
        )


def result(measured: Measured, artifacts: dict[str, str] | None = None, **kwargs) -> TaskResult:
    """The task's result from what it measured: the seed table's medians, every token's statistics (TTFT, TPOT,
    ITL percentiles; src.common.latency) and their times as an artifact, and the task's own figures."""
    summary = {**summarize(measured.rows), **latency.summary(measured.token_times), **measured.summary}
    files = {latency.ARTIFACT: latency.jsonl(measured.token_times), **(artifacts or {})}
    out = TaskResult(measured.rows, summary, artifacts=files, series=dict(measured.series), **kwargs)
    out.tags.update(measured.tags)
    return out
