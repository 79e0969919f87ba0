"""The seeds' table, reproduced: each seed configuration at its real shape (random weights: timing only),
run on this machine, beside the figures the seed documents report for the PHX, HPT and STX NPUs.

    .venv/bin/python -m scripts.bench_seeds                         # every row (hours on 2 cores)
    .venv/bin/python -m scripts.bench_seeds models=llama-2-7b quick=true task.repeats=1
    .venv/bin/python -m scripts.bench_seeds quick=true resume=true  # finish an interrupted run

One sweep per model (its precisions, and its assisted-generation rows, which are timed for cost only:
random weights agree by chance). quick=true times two prompt lengths and 16 new tokens instead of the
seeds' seven lengths and 60. Writes reports/bench-seeds-<time>.md.

The seed figures below are copied from AMD's Ryzen AI LLM examples (the documents quantspec grew out
of: "Llama2 - w8a8, w8a16 with SmoothQuant", "Assisted generation - Llama2", "Assisted generation"
(OPT), "Assisted Generation - Qwen1.5-7B-Chat"): the median time/token over each table's rows and the
prefill at 128 prompt tokens (512 for the documents whose tables start there), on each NPU.
"""

from __future__ import annotations

import math
import subprocess
import sys
from pathlib import Path

from mlflow.tracking import MlflowClient

from scripts import bench
from src.common.environment import PROJECT_ROOT as ROOT
from src.common.metrics import EXAMPLE, markdown_table
from src.common.settings import Setting
from src.tracking.readback.sweeps import sweep_jobs
from src.tracking.store.names import default_uri

# (model, precision, draft, platform, seed time/token ms, seed prefill ms, at prompt tokens, source)
SEEDS = [
    ("llama-2-7b", "w8a8", "none", "PHX", 876.7, 3726, 128, "Llama2 w8a8/w8a16 SmoothQuant, PHX w8a8"),
    ("llama-2-7b", "w8a8", "none", "HPT", 510.4, 3289, 128, "Llama2 w8a8/w8a16 SmoothQuant, HPT w8a8"),
    ("llama-2-7b", "w8a8", "none", "STX", 410.6, 5433, 128, "Llama2 w8a8/w8a16 SmoothQuant, STX B0 w8a8"),
    ("llama-2-7b", "w8a16", "none", "STX", 216.1, 5028, 128, "Llama2 w8a8/w8a16 SmoothQuant, STX B0 w8a16"),
    ("llama-2-7b", "w4a16", "llama-160m", "STX", 219.6, 4895, 512, "Assisted generation - Llama2, STX B0 (w4abf16)"),
    ("opt-6.7b", "w4a16", "none", "PHX", 355.4, 26912, 512, "Assisted generation (OPT), PHX; precision not stated"),
    ("opt-6.7b", "w4a16", "opt-125m", "PHX", 211.1, 27839, 512, "Assisted generation (OPT), PHX, with opt-125m"),
    ("Qwen1.5-7B-Chat", "w4a16", "none", "PHX", 333.9, 21686, 512, "Assisted Generation - Qwen1.5-7B-Chat, PHX"),
    (
        "Qwen1.5-7B-Chat",
        "w4a16",
        "Qwen1.5-0.5B-Chat",
        "PHX",
        279.2,
        21890,
        512,
        "Assisted Generation - Qwen1.5-7B-Chat, PHX, with the 0.5B draft",
    ),
]
PRECISIONS = ("bf16", "w8a8", "w8a16", "w4a16")


def sweep(model: str, drafts: list[str], quick: bool, resume: bool, extra: list[str]) -> tuple[Path, int]:
    """The model's precisions, then one run per assisted row (the draft at bf16 beside the target at
    w4a16), all into one sweep directory: with `resume`, the model's latest one, whose finished jobs are
    skipped (a sweep resumes in its own directory)."""
    earlier = sorted((ROOT / "multirun").glob(f"bench-seeds-{model}-*")) if resume else []
    sweep_dir = earlier[-1] if earlier else ROOT / "multirun" / bench.stamp(f"seeds-{model}")
    lengths = "[128,512]" if quick else "[4,8,16,32,64,128,256,512]"
    base = [
        sys.executable,
        "-m",
        "src.run",
        "-m",
        f"model={model}",
        "model.weights=random",
        "task=benchmark",
        f"task.prompt_lengths={lengths}",
        f"task.max_new_tokens={16 if quick else 60}",
        f"hydra.sweep.dir={sweep_dir}",
        # calibration of random weights calibrates nothing: the smallest that runs the real passes, and
        # no AWQ clipping search (25 minutes at 7B here, to clip random numbers)
        "precision.calib_samples=4",
        "precision.calib_seq_len=128",
        "precision.awq_search_tokens=512",
        "precision.awq_grid=10",
        "precision.awq_clip=false",
        *extra,
    ]
    code = 0
    for variant in [[f"precision={','.join(PRECISIONS)}"], *[["precision=w4a16", f"draft={d}"] for d in drafts]]:
        cmd = [*base, *variant]
        print("running:", " ".join(cmd[1:]), flush=True)
        code = max(code, subprocess.run(cmd, cwd=ROOT).returncode)
    return sweep_dir, code


def per_length(uri: str, job, metric: str, tokens: int) -> float:
    """The job's `metric` at the example of `tokens` prompt tokens (step = example number)."""
    client = MlflowClient(uri)
    step = next(
        (m.step for m in client.get_metric_history(job.run_id, f"{EXAMPLE}prompt_tokens") if int(m.value) == tokens),
        None,
    )
    return {m.step: m.value for m in client.get_metric_history(job.run_id, EXAMPLE + metric)}.get(step, math.nan)


COMMAND = bench.command(
    "bench_seeds",
    __doc__,
    [
        Setting("models", tuple(sorted({s[0] for s in SEEDS})), "the seeds' models to run"),
        Setting("quick", False, "two prompt lengths and 16 new tokens instead of the seeds' seven lengths and 60"),
        Setting("resume", False, "go on with each model's latest sweep"),
    ],
)


def main(argv: list[str]) -> int:
    args, extra = bench.parse(COMMAND, argv)
    uri = next((o.split("=", 1)[1] for o in extra if o.startswith("tracking.uri=")), default_uri())
    rows, code = [], 0
    for model in args.models:
        drafts = sorted({s[2] for s in SEEDS if s[0] == model and s[2] != "none"})
        sweep_dir, rc = sweep(model, drafts, args.quick, args.resume, extra)
        code = max(code, rc)
        _, jobs = sweep_jobs(uri, sweep_id=str(sweep_dir.resolve()))
        done = {(j.choice("precision"), j.choice("draft")): j for j in jobs if j.tags.get("outcome") == "finished"}
        for precision in PRECISIONS:
            job = done.get((precision, "none"))
            seeds = [s for s in SEEDS if s[:3] == (model, precision, "none")]
            for seed in seeds or [(model, precision, "none", "-", math.nan, math.nan, 128, "")]:
                rows.append(_row(uri, job, seed))
        for draft in drafts:
            for seed in [s for s in SEEDS if s[0] == model and s[2] == draft]:
                rows.append(_row(uri, done.get(("w4a16", draft)), seed))
    table = markdown_table(
        [
            "model",
            "precision",
            "draft",
            "quantspec ms/token (this CPU)",
            "decode efficiency",
            "quantspec prefill ms",
            "at tokens",
            "seed NPU",
            "seed ms/token",
            "seed prefill ms",
            "seed source",
        ],
        rows,
    )
    bench.publish(
        args.doc,
        "seven-b",
        "The seeds' table at the seeds' shapes, beside their NPU figures",
        table,
        f"One sweep per model (its precisions, then each assisted row: the seed's draft at bf16 beside the target "
        f"at w4a16), random weights{'; quick=true: short prompts and cut calibration' if args.quick else ''}.",
        bench.stamp("seeds"),
    )
    return code


def _row(uri: str, job, seed) -> list:
    model, precision, draft, platform, seed_tpt, seed_prefill, tokens, source = seed
    metrics = job.metrics if job else {}
    prefill = per_length(uri, job, "prefill_ms", tokens) if job else math.nan
    return [
        model,
        precision,
        draft,
        metrics.get("time_per_token_ms_median", math.nan),
        metrics.get("decode_efficiency_median", math.nan),
        prefill,
        tokens,
        platform,
        seed_tpt,
        seed_prefill,
        source,
    ]


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
