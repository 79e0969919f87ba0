#!/usr/bin/env python
"""Benchmark the runtimes on the same model in one sweep: time/token, prefill and perplexity per engine.

    .venv/bin/python scripts/bench_runtimes.py                   # native, openvino, ort_genai at fp32, w8a16, w4a16
    .venv/bin/python scripts/bench_runtimes.py --engines native ort_genai --precisions fp32 w4a16 --doc

One sweep (task=benchmark for time/token and prefill, task=perplexity for quality) over engines × precisions,
so each figure is measured on one machine beside the others; a combination a runtime cannot run is a skip with
its reason. Each runtime quantizes by its own method (OpenVINO: NNCF; ONNX Runtime GenAI: its model builder's
round-to-nearest), which the perplexity column shows. Figures are read back from the MLflow store; --doc also
appends the table to the docs' benchmark page (docs/benchmarks/runtimes.md).
"""

from __future__ import annotations

import argparse
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
from src.tracking.report import save_markdown  # noqa: E402
from src.tracking.sweeps import sweep_jobs  # noqa: E402


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[1])
    parser.add_argument("--engines", nargs="+", default=["native", "openvino", "ort_genai"])
    parser.add_argument("--precisions", nargs="+", default=["fp32", "w8a16", "w4a16"])
    benchpage.add_argument(parser)
    args, overrides = parser.parse_known_args(argv)
    uri = next((o.split("=", 1)[1] for o in overrides if o.startswith("tracking.uri=")), default_uri())
    sweep_dir = ROOT / "multirun" / f"bench-runtimes-{time.strftime('%Y-%m-%d_%H-%M-%S')}"
    sweep = [
        f"engine={','.join(args.engines)}",
        f"precision={','.join(args.precisions)}",
        "task=benchmark,perplexity",
        *overrides,
    ]
    cmd = [sys.executable, "-m", "src.run", "-m", *sweep, f"hydra.sweep.dir={sweep_dir}"]
    print("running:", " ".join(cmd[1:]), flush=True)
    done = subprocess.run(cmd, cwd=ROOT)
    if done.returncode == 2:  # the command line refused, in one line: no sweep to read back
        return 2
    _, jobs = sweep_jobs(uri, sweep_id=str(sweep_dir.resolve()))
    by = {(j.choice("engine"), j.choice("precision"), j.choice("task")): j for j in jobs}

    def cell(engine: str, precision: str, task: str, metric: str, digits: int) -> str:
        job = by.get((engine, precision, task))
        if job is None:
            return "–"
        if job.tags.get("outcome") != "finished":
            return f"({job.tags.get('outcome', '?')})"
        value = job.metrics.get(metric, math.nan)
        return f"{value:.{digits}f}"

    head = (
        ["precision"]
        + [f"{e} ms/token" for e in args.engines]
        + [f"{e} prefill ms" for e in args.engines]
        + [f"{e} perplexity" for e in args.engines]
    )
    rows = [
        [p]
        + [cell(e, p, "benchmark", "time_per_token_ms_median", 1) for e in args.engines]
        + [cell(e, p, "benchmark", "prefill_ms_median", 0) for e in args.engines]
        + [cell(e, p, "perplexity", "perplexity", 3) for e in args.engines]
        for p in args.precisions
    ]
    table = markdown_table(head, rows)
    skips = sorted(
        {
            f"{j.choice('engine')} {j.choice('precision')}: {j.tags.get('outcome_reason', '')}"
            for j in jobs
            if j.tags.get("outcome") == "skipped"
        }
    )
    text = table + ("\n\nSkipped:\n\n" + "\n".join(f"- {s}" for s in skips) if skips else "")
    print("\n" + text)
    save_markdown(sweep_dir.name, f"`{' '.join(cmd[2:])}`\n\n{text}\n")
    benchpage.record(
        args.doc,
        "runtimes",
        f"Runtimes side by side: {', '.join(args.engines)}",
        f"`python -m src.run -m {' '.join(sweep)}`: one sweep, the "
        f"benchmark task's prompts (medians over them) and 8 perplexity windows; each runtime "
        f"quantizes by its own method.\n\n{text}",
    )
    return done.returncode


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
