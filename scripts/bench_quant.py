"""Benchmark every precision on one model in one sweep; print speed and quality as ratios to fp32.

    .venv/bin/python -m scripts.bench_quant                      # gemma3-270m, every precision in conf/precision/
    .venv/bin/python -m scripts.bench_quant model=tiny-llama     # any extra Hydra overrides
    .venv/bin/python -m scripts.bench_quant doc=true             # also on the docs' benchmark page

One sweep (task=benchmark for decode time/token and prefill, task=perplexity for quality), so every
ratio is measured side by side on one machine. Figures are read back from the MLflow store.
"""

from __future__ import annotations

import math
import sys

from scripts import bench
from src.common.metrics import markdown_table
from src.common.settings import Setting
from src.tracking.readback.compare import ratio

PRECISIONS = bench.every_precision()
COMMAND = bench.command(
    "bench_quant", __doc__, [Setting("precisions", PRECISIONS, "the precisions swept (fp32 is the baseline)")]
)


def main(argv: list[str]) -> int:
    args, overrides = bench.parse(COMMAND, argv)
    # Three timed runs per prompt, the median kept: this machine's neighbours move single runs by 30%.
    sweep = bench.run_sweep(
        "quant",
        [f"precision={','.join(args.precisions)}", "task=benchmark,perplexity", "task.repeats=3", *overrides],
    )
    if sweep is None:
        return 2
    by = sweep.by("precision", "task")  # each the median over its quiet rounds
    base = {
        k: by.get(("fp32", t), {}).get(m)
        for k, t, m in [
            ("tpt", "benchmark", "time_per_token_ms_median"),
            ("prefill", "benchmark", "prefill_ms_median"),
            ("ppl", "perplexity", "perplexity"),
        ]
    }
    rows = []
    for p in args.precisions:
        bench_m, ppl = by.get((p, "benchmark"), {}), by.get((p, "perplexity"), {})
        tpt, prefill, perplexity = (
            bench_m.get("time_per_token_ms_median"),
            bench_m.get("prefill_ms_median"),
            ppl.get("perplexity"),
        )
        rows.append(
            [
                p,
                tpt or math.nan,
                ratio(base["tpt"], tpt),
                prefill or math.nan,
                ratio(base["prefill"], prefill),
                perplexity or math.nan,
                ratio(perplexity, base["ppl"]),
            ]
        )
    table = markdown_table(
        [
            "precision",
            "time/token (ms)",
            "speedup vs fp32",
            "prefill (ms)",
            "prefill speedup",
            "perplexity",
            "perplexity / fp32",
        ],
        rows,
    )
    sweep.publish(
        args.doc,
        "precisions",
        "Every precision in one sweep",
        table,
        f"`{sweep.command}`, three timed runs per prompt, the median kept (and over a job's quiet rounds where a "
        "busy round was measured again); ratios to fp32 within the sweep.",
    )
    return sweep.returncode


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
