#!/usr/bin/env python
"""What measuring quality against a reference costs: the reference pass (once per model, windows and
reference), reading it back from the cache (every later job), and the job's own scoring pass with and
without the reference's top-k to gather, timed in turns over several rounds in one process.

    .venv/bin/python scripts/bench_reference.py                     # gemma3-270m, w4a16, 8 windows of 512
    .venv/bin/python scripts/bench_reference.py --rounds 5 precision=w8a8 task.windows=4

Each round, in this order: (1) the reference pass after its cache entry is removed (its own model load
from the converted-model cache, the float forward of each window, the top-k, the safetensors write and
manifest), (2) the same call on the filled cache (manifest check and read), (3) the job's scoring pass gathering the reference's top-k,
(4) the same pass without it (what perplexity alone costs). Ratios are of medians over the rounds.
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402
from hydra import compose, initialize_config_dir  # noqa: E402
from omegaconf import OmegaConf  # noqa: E402

from src.assembly.config import job_config_from_dict  # noqa: E402
from src.assembly.job import build  # noqa: E402
from src.common import benchpage  # noqa: E402
from src.common.environment import cpu_model  # noqa: E402
from src.common.metrics import markdown_table, md_text  # noqa: E402
from src.tasks.perplexity import windows  # noqa: E402
from src.tracking.report import save_markdown  # noqa: E402


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    benchpage.add_argument(parser)
    args, overrides = parser.parse_known_args(argv)
    with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base="1.3"):
        cfg = compose("config", overrides=["precision=w4a16", "task=perplexity", *overrides])
    job = build(
        job_config_from_dict(
            {k: OmegaConf.to_container(cfg[k], resolve=True) if OmegaConf.is_config(cfg[k]) else cfg[k] for k in cfg}
        )
    )
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
    text = f"{title}\n\n" + markdown_table(["step", "median s", "min–max s", "÷ job scoring alone"], rows)
    print("\n" + text)
    save_markdown("bench_reference", text)
    benchpage.record(args.doc, "quality", "What the reference costs", text, rounds=args.rounds)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
