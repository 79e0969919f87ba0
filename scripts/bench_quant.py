#!/usr/bin/env python
"""Benchmark every precision on one model in one sweep; print speed and quality as ratios to fp32.

    .venv/bin/python scripts/bench_quant.py                      # gemma3-270m, all six precisions
    .venv/bin/python scripts/bench_quant.py model=tiny-llama     # any extra Hydra overrides
    .venv/bin/python scripts/bench_quant.py --doc                # also on the docs' benchmark page

One sweep (task=benchmark for decode time/token and prefill, task=perplexity for quality), so every
ratio is measured side by side on one machine. Figures are read back from the MLflow store.
"""

from __future__ import annotations

import math
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from src.common import benchpage  # noqa: E402
from src.common.metrics import markdown_table  # noqa: E402
from src.tracking import default_uri  # noqa: E402
from src.tracking.report import ratio, save_markdown  # noqa: E402
from src.tracking.sweeps import sweep_jobs  # noqa: E402

PRECISIONS = ["fp32", "bf16", "w8a8", "w8a16", "w4a16", "rtn"]


def main(argv: list[str]) -> int:
    doc, overrides = "--doc" in argv, [a for a in argv if a != "--doc"]
    uri = next((o.split("=", 1)[1] for o in overrides if o.startswith("tracking.uri=")), default_uri())
    sweep_dir = ROOT / "multirun" / f"bench-quant-{time.strftime('%Y-%m-%d_%H-%M-%S')}"
    # Three timed runs per prompt, the median kept: this machine's neighbours move single runs by 30%.
    cmd = [
        sys.executable,
        "-m",
        "src.run",
        "-m",
        f"precision={','.join(PRECISIONS)}",
        "task=benchmark,perplexity",
        "task.repeats=3",
        f"hydra.sweep.dir={sweep_dir}",
        *overrides,
    ]
    print("running:", " ".join(cmd[1:]), flush=True)
    done = subprocess.run(cmd, cwd=ROOT)
    if done.returncode == 2:  # the command line refused, in one line: no sweep to read back
        return 2
    _, jobs = sweep_jobs(uri, sweep_id=str(sweep_dir.resolve()))
    by = {(j.choice("precision"), j.choice("task")): j.metrics for j in jobs if j.tags.get("outcome") == "finished"}
    base = {
        k: by.get(("fp32", t), {}).get(m)
        for k, t, m in [
            ("tpt", "benchmark", "time_per_token_ms_median"),
            ("prefill", "benchmark", "prefill_ms_median"),
            ("ppl", "perplexity", "perplexity"),
        ]
    }
    rows = []
    for p in PRECISIONS:
        bench, ppl = by.get((p, "benchmark"), {}), by.get((p, "perplexity"), {})
        tpt, prefill, perplexity = (
            bench.get("time_per_token_ms_median"),
            bench.get("prefill_ms_median"),
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
    print("\n" + table)
    save_markdown(sweep_dir.name, f"`{' '.join(cmd[2:])}`\n\n{table}\n")
    benchpage.record(
        doc,
        "precisions",
        "Every precision in one sweep",
        f"`python -m src.run {' '.join(cmd[3:])}`, "
        f"three timed runs per prompt, the median kept; ratios to fp32 within the sweep.\n\n{table}",
    )
    return done.returncode


if __name__ == "__main__":
    if {"-h", "--help"} & set(sys.argv[1:]):
        print(__doc__)
        sys.exit(0)
    sys.exit(main(sys.argv[1:]))
