"""Benchmark the runtimes on the same model in one sweep: time/token, prefill and perplexity per engine.

    .venv/bin/python -m scripts.bench_runtimes                   # every runtime at fp32, bf16, w8a8, rtn
    .venv/bin/python -m scripts.bench_runtimes engines=native,ort_genai precisions=fp32,rtn doc=true

One sweep (task=benchmark for time/token and prefill, task=perplexity for quality) over engines × precisions,
so each figure is measured on one machine beside the others; a combination a runtime cannot run is a skip with
its reason. Each runtime quantizes by its own method (OpenVINO: NNCF; ONNX Runtime GenAI: its model builder's
round-to-nearest), which the perplexity column shows. The sweep keeps no linears wider (precision.wide_linears=[],
on every engine alike): neither runtime can name linears to keep at int8, so rtn is then int4 in groups of 128 with
an int8 head everywhere (src.engine.runtimes.recipe says what each runtime can express). Figures are read back from the MLflow store; doc=true also
appends the table to the docs' benchmark page (docs/benchmarks/runtimes.md).
"""

from __future__ import annotations

import math
import sys

from scripts import bench
from src.common.metrics import markdown_table
from src.common.settings import Setting

COMMAND = bench.command(
    "bench_runtimes",
    __doc__,
    [
        Setting(
            "engines",
            ("native", "openvino", "ort_genai", "llamacpp"),
            "the runtimes swept (one not installed is a skip with its reason)",
        ),
        Setting("precisions", ("fp32", "bf16", "w8a8", "rtn"), "the precisions swept (llama.cpp: fp32, bf16)"),
    ],
)


def main(argv: list[str]) -> int:
    args, overrides = bench.parse(COMMAND, argv)
    sweep = bench.run_sweep(
        "runtimes",
        [
            f"engine={','.join(args.engines)}",
            f"precision={','.join(args.precisions)}",
            "task=benchmark,perplexity",
            "precision.wide_linears=[]",  # what every runtime can express (the module's docstring)
            *overrides,
        ],
    )
    if sweep is None:
        return 2
    jobs = sweep.jobs
    keys = ("engine", "precision", "task")
    by = {tuple(j.choice(k) for k in keys): j for j in jobs}
    figures = sweep.by(*keys)  # each the median over its quiet rounds

    def cell(engine: str, precision: str, task: str, metric: str, digits: int) -> str:
        job = by.get((engine, precision, task))
        if job is None:
            return "–"
        if (engine, precision, task) not in figures:
            return f"({job.tags.get('outcome', '?')})"
        value = figures[(engine, precision, task)].get(metric, math.nan)
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
    sweep.publish(
        args.doc,
        "runtimes",
        f"Runtimes side by side: {', '.join(args.engines)}",
        text,
        f"`{sweep.command}`: one sweep, the benchmark task's prompts (medians over them) and 8 perplexity "
        f"windows; each runtime quantizes by its own method.",
    )
    return sweep.returncode


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
