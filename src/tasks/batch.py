"""task=batch: offline throughput at each batch size, as llama.cpp's llama-batched-bench measures it.

For each B of task.batch_sizes: B sequences, each a prompt of task.prompt_tokens cut from the corpus (a
different stretch of it each), are prefilled together (PP), then decoded together for task.output_tokens steps of
B rows, end of sequence ignored (TG). The figures are llama-batched-bench's: PP and TG tokens a second over
their own time, and both over the whole (`batch_*_b<B>` metrics; the table as the artifact batch.md).

task.runner=quantspec runs them on the batched C++ step the server uses (src.engine.batching.BatchStep): the
prompts fed in steps of at most task.max_batch_tokens rows, oldest first, as the server feeds them, each
prompt's last chunk giving its first token; then each TG step one row a sequence. task.runner=llama-batched-bench
runs llama.cpp's own tool on the model's GGUF with the same -npp, -ntg, -npl (its executable:
QUANTSPEC_LLAMA_BATCHED_BENCH or the one scripts/build_llama_server puts in the cache) and reads its JSON lines.
Each batch size is timed task.repeats times after task.warmup untimed runs, the run of median total time kept.
"""

from __future__ import annotations

import json
import logging
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from src.common import envvars
from src.common.metrics import markdown_table
from src.data.corpus import bos_prefix, leading_ids
from src.engine import batching
from src.tasks.timed import TaskInputs, TaskResult

log = logging.getLogger(__name__)

BATCHED_BENCH = "llama-batched-bench"
RUN_S = 3600.0  # the most one llama-batched-bench run may take (16 sequences of a 7B on 2 cores: minutes)


class BatchError(RuntimeError):
    """The batched run could not be made (the message is one line)."""


@dataclass
class Timing:
    """One batch size's run: its prompt tokens and their time, its generated tokens and theirs (seconds)."""

    batch: int
    pp_tokens: int
    pp_s: float
    tg_tokens: int
    tg_s: float

    @property
    def pp_rate(self) -> float:
        return self.pp_tokens / self.pp_s

    @property
    def tg_rate(self) -> float:
        return self.tg_tokens / self.tg_s

    @property
    def rate(self) -> float:
        return (self.pp_tokens + self.tg_tokens) / (self.pp_s + self.tg_s)

    def figures(self) -> dict[str, float]:
        b = self.batch
        return {
            f"batch_pp_tokens_per_s_b{b}": self.pp_rate,
            f"batch_tg_tokens_per_s_b{b}": self.tg_rate,
            f"batch_tokens_per_s_b{b}": self.rate,
            f"batch_pp_s_b{b}": self.pp_s,
            f"batch_tg_s_b{b}": self.tg_s,
        }


def run(inputs: TaskInputs) -> TaskResult:
    task = inputs.task
    timings = _llama(inputs) if task.runner == BATCHED_BENCH else _quantspec(inputs)
    summary: dict[str, float] = {}
    for t in timings:
        summary.update(t.figures())
    best = max(timings, key=lambda t: t.tg_rate)
    summary["batch_tg_tokens_per_s_max"] = best.tg_rate
    summary["batch_tg_best_b"] = float(best.batch)
    one = next((t for t in timings if t.batch == 1), None)
    if one is not None:  # how far batching multiplies one sequence's generation rate
        summary["batch_tg_gain_max"] = best.tg_rate / one.tg_rate
    return TaskResult([], summary, artifacts={"batch.md": _table(task, timings)})


def _table(task, timings: list[Timing]) -> str:
    head = ["B", "PP tokens", "PP s", "PP tok/s", "TG tokens", "TG s", "TG tok/s", "total s", "tok/s"]
    rows = [
        [
            t.batch, t.pp_tokens, f"{t.pp_s:.3f}", f"{t.pp_rate:.1f}", t.tg_tokens, f"{t.tg_s:.3f}",
            f"{t.tg_rate:.1f}", f"{t.pp_s + t.tg_s:.3f}", f"{t.rate:.1f}",
        ]
        for t in timings
    ]  # fmt: skip
    about = f"{task.runner}: {task.prompt_tokens} prompt tokens and {task.output_tokens} generated tokens a sequence"
    return f"{about}\n\n{markdown_table(head, rows)}\n"


def cut(tokenizer, corpus: str, count: int, length: int) -> list[list[int]]:
    """`count` prompts of `length` tokens (with the BOS the tokenizer adds), consecutive stretches of the corpus:
    each sequence its own text, as llama-batched-bench's are its own (-pps off)."""
    prefix = bos_prefix(tokenizer)
    body = length - len(prefix)
    ids = leading_ids(tokenizer, corpus, count * body)
    if len(ids) < count * body:
        raise BatchError(
            f"the corpus has {len(ids)} tokens, too few for {count} prompts of {length}: use a larger dataset, "
            "fewer task.batch_sizes or a shorter task.prompt_tokens"
        )
    return [prefix + ids[i * body : (i + 1) * body] for i in range(count)]


def _quantspec(inputs: TaskInputs) -> list[Timing]:
    task = inputs.task
    step = batching.BatchStep(inputs.model)  # Unbatchable, one line, before anything is timed
    prompts = cut(inputs.tokenizer, inputs.corpus(), max(task.batch_sizes), task.prompt_tokens)
    for _ in range(task.warmup):
        _once(step, prompts[: min(task.batch_sizes)], min(task.output_tokens, 4), task.max_batch_tokens)
    found = []
    for b in task.batch_sizes:
        runs = [_once(step, prompts[:b], task.output_tokens, task.max_batch_tokens) for _ in range(task.repeats)]
        kept = sorted(runs, key=lambda t: t.pp_s + t.tg_s)[len(runs) // 2]
        log.info("batch %d: PP %.1f tok/s, TG %.1f tok/s", b, kept.pp_rate, kept.tg_rate)
        found.append(kept)
    return found


@torch.inference_mode()
def _once(
    step: batching.BatchStep, prompts: list[list[int]], new: int, budget: int, keep: list | None = None
) -> Timing:
    """The prompts prefilled together (steps of at most `budget` rows, oldest first), then `new` steps of one row
    each: the two phases' times (`keep`, where given, gets the sequences)."""
    seqs = [batching.Sequence(p, new + 1, lambda t, d: None, ignore_eos=True) for p in prompts]
    if keep is not None:
        keep.extend(seqs)
    for seq in seqs:
        seq.cache = step.new_cache()
    start = time.perf_counter()
    while any(seq.prefilling for seq in seqs):
        rows, left = [], budget
        for seq in seqs:
            if seq.prefilling and left > 0:
                chunk = seq.prompt[seq.fed : seq.fed + left]
                rows.append((seq, chunk, seq.fed + len(chunk) == len(seq.prompt)))
                left -= len(chunk)
        chosen = iter(step(rows))
        for seq, chunk, emits in rows:
            seq.fed += len(chunk)
            if emits:
                seq.tokens.append(next(chosen))
    prefilled = time.perf_counter()
    for _ in range(new):
        for seq, token in zip(seqs, step([(seq, [seq.next_input()], True) for seq in seqs]), strict=True):
            seq.tokens.append(token)
    end = time.perf_counter()
    return Timing(len(seqs), sum(len(p) for p in prompts), prefilled - start, len(seqs) * new, end - prefilled)


def batched_bench_path(cache_dir: Path) -> Path:
    """llama-batched-bench: QUANTSPEC_LLAMA_BATCHED_BENCH, or the cache's (scripts/build_llama_server)."""
    named = envvars.executable("QUANTSPEC_LLAMA_BATCHED_BENCH")
    path = named or cache_dir / "tools" / "llama.cpp" / "bin" / BATCHED_BENCH
    if not path.is_file():
        raise BatchError(
            f"no {BATCHED_BENCH} at {path}: run `bash scripts/build_llama_server` (a few minutes) or set "
            "QUANTSPEC_LLAMA_BATCHED_BENCH to one"
        )
    return path


def _llama(inputs: TaskInputs) -> list[Timing]:
    task = inputs.task
    exe, gguf = batched_bench_path(inputs.cache_dir), inputs.gguf()
    context = max(task.batch_sizes) * (task.prompt_tokens + task.output_tokens) + 16

    def command(sizes, new: int) -> list[str]:
        return [
            str(exe), "-m", str(gguf), "-c", str(context), "-b", "2048", "-ub", "512",
            "-npp", str(task.prompt_tokens), "-ntg", str(new), "-npl", ",".join(map(str, sizes)),
            "-t", str(torch.get_num_threads()), "--output-format", "jsonl",
        ]  # fmt: skip

    for _ in range(task.warmup):  # an untimed run of the smallest batch: the weights read in, the threads up
        _batched_bench(command([min(task.batch_sizes)], min(task.output_tokens, 4)))
    runs = [_batched_bench(command(task.batch_sizes, task.output_tokens)) for _ in range(task.repeats)]
    found = []
    for b in task.batch_sizes:
        of_b = sorted((r[b] for r in runs), key=lambda t: t.pp_s + t.tg_s)
        found.append(of_b[len(of_b) // 2])
    return found


def _batched_bench(cmd: list[str]) -> dict[int, Timing]:
    """One llama-batched-bench run: each batch size's timing, from its JSON lines."""
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=RUN_S)
    except subprocess.TimeoutExpired:
        raise BatchError(f"{BATCHED_BENCH} ran past {RUN_S:.0f} s; ended") from None
    # its figures as JSON lines, among its log's (llama.cpp's LOG goes to stdout, its LOG_INF to stderr)
    lines = [line for line in (done.stdout + "\n" + done.stderr).splitlines() if line.startswith("{")]
    if done.returncode != 0 or not lines:
        tail = (done.stderr.strip().splitlines() or ["no output"])[-1][:300]
        raise BatchError(f"{BATCHED_BENCH} exited {done.returncode}: {tail}")
    found = {}
    for line in lines:
        r = json.loads(line)
        found[int(r["pl"])] = Timing(
            int(r["pl"]), int(r["pp"]) * int(r["pl"]), float(r["t_pp"]), int(r["tg"]) * int(r["pl"]), float(r["t_tg"])
        )
    return found
