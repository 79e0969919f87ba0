"""What measuring quality against a reference costs: the reference pass (once per model, windows and
reference), reading it back from the cache (every later job), and the job's own scoring pass with and
without the reference's top-k to gather, timed in turns over several rounds in one process.

    .venv/bin/python -m scripts.bench_reference                     # gemma3-270m, w4a16, 8 windows of 512
    .venv/bin/python -m scripts.bench_reference rounds=5 task.windows=4

Each round, in this order: (1) the reference pass after its cache entry is removed (its own model load
from the converted-model cache, the float forward of each window, the top-k, the safetensors write and
manifest), (2) the same call on the filled cache (manifest check and read), (3) the job's scoring pass gathering the reference's top-k,
(4) the same pass without it (what perplexity alone costs). Ratios are of medians over the rounds.
"""

from __future__ import annotations

import shutil
import statistics
import sys
import time

import torch

from scripts import bench
from scripts.jobs import build_job
from src.common.environment import cpu_model
from src.common.metrics import markdown_table, md_text
from src.common.settings import Setting
from src.tasks.perplexity import windows

COMMAND = bench.command("bench_reference", __doc__, [Setting("rounds", 3, "rounds in turns")])


def main(argv: list[str]) -> int:
    args, overrides = bench.parse(COMMAND, argv)
    job = build_job("w4a16", "task=perplexity", *overrides)
    inputs, task = job.inputs(), job.cfg.task
    chunks, _ = windows(inputs.tokenizer, inputs.corpus(), task.window, task.windows)
    times: dict[str, list[float]] = {
        k: []
        for k in (
            "reference pass (cache miss)",
            "cached reference read",
            "job scoring, gathering top-k",
            "job scoring alone",
        )
    }
    ref = inputs.reference
    for r in range(args.rounds):
        # a miss: the cached reference removed (the run rebuilds it, byte for byte; the model's cache stays)
        shutil.rmtree(ref.windows_cache(chunks), ignore_errors=True)
        start = time.perf_counter()
        refs, _ = ref.windows(chunks)
        times["reference pass (cache miss)"].append(time.perf_counter() - start)
        start = time.perf_counter()
        refs, _ = ref.windows(chunks)
        times["cached reference read"].append(time.perf_counter() - start)
        with torch.inference_mode():
            start = time.perf_counter()
            for c, w in zip(chunks, refs):
                inputs.score(c, w.indices)
            times["job scoring, gathering top-k"].append(time.perf_counter() - start)
            start = time.perf_counter()
            for c in chunks:
                inputs.score(c, None)
            times["job scoring alone"].append(time.perf_counter() - start)
        print(f"round {r + 1}: " + ", ".join(f"{k} {v[-1]:.2f} s" for k, v in times.items()), flush=True)
    alone = statistics.median(times["job scoring alone"])
    rows = [
        [k, f"{statistics.median(v):.2f}", f"{min(v):.2f}–{max(v):.2f}", f"{statistics.median(v) / alone:.2f}×"]
        for k, v in times.items()
    ]
    title = (
        f"{job.cfg.model.name} {job.cfg.precision.name}, {len(chunks)} windows of {task.window} tokens, reference "
        f"{ref.precision} top-{task.reference_top_k}, {args.rounds} rounds in turns, {torch.get_num_threads()} "
        f"threads, {md_text(cpu_model())}"
    )
    table = markdown_table(["step", "median s", "min–max s", "÷ job scoring alone"], rows)
    bench.publish(args.doc, "quality", "What the reference costs", table, title, "bench_reference", rounds=args.rounds)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
