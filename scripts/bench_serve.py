"""Benchmark serving under load: quantspec's server and llama.cpp's llama-server, the same load generator, in turns.

    .venv/bin/python -m scripts.bench_serve                                # w4a16, concurrency 1 and 8, 2 rounds
    .venv/bin/python -m scripts.bench_serve levels=1,2,4,8 rounds=3 doc=true

One sweep of task=serve over servers × concurrency levels in interleaved rounds (src.run's rounds=): each level
drives its server with aiperf (the job's task.prompt_tokens and task.output_tokens). The table gives each level's
output tokens a second (the median over its rounds), its ratio to the same server at the lowest level, quantspec's
ratio to llama-server at the same level, and the latency beside it (TTFT p99, TPOT p50). llama-server needs
`bash scripts/build_llama_server` first (or QUANTSPEC_LLAMA_SERVER); servers=quantspec measures ours alone;
servers=quantspec,llama-server,vllm adds vLLM's CPU build on the float checkpoint at bf16 (`bash
scripts/install_vllm` first, or QUANTSPEC_VLLM).
doc=true appends the table to docs/benchmarks/serving.md.
"""

from __future__ import annotations

import math
import sys

from scripts import bench
from src.common.metrics import markdown_table
from src.common.settings import Setting

COMMAND = bench.command(
    "bench_serve",
    __doc__,
    [
        Setting("precision", "w4a16", "quantspec's precision (llama-server serves the model's own GGUF)"),
        Setting(
            "servers", ("quantspec", "llama-server"), "the servers swept (task.server: quantspec, llama-server, vllm)"
        ),
        Setting("levels", ("1", "8"), "the concurrency levels (task.concurrency)"),
        Setting("rounds", 2, "interleaved rounds (src.run's rounds=)"),
        Setting(
            "batch_activations",
            ("int16",),
            "quantspec's precision.batch_activations, each its own rows (int8: its batched steps on int8 activations)",
            choices=("int16", "int8"),
        ),
    ],
)


def main(argv: list[str]) -> int:
    args, overrides = bench.parse(COMMAND, argv)
    levels = bench.whole_numbers("levels", args.levels)
    sweep = bench.run_sweep(
        "serve",
        [
            "task=serve",
            f"precision={args.precision}",
            f"task.server={','.join(args.servers)}",
            f"task.concurrency={','.join(map(str, levels))}",
            f"rounds={args.rounds}",
            f"precision.batch_activations={','.join(args.batch_activations)}",
            *overrides,
        ],
    )
    if sweep is None:
        return 2
    figures = by_server_level(sweep)
    low = min(levels)
    # quantspec once per batch_activations; another server's jobs (which read no precision field) all count as its own
    names = [
        (server, kind if server == "quantspec" and len(args.batch_activations) > 1 else None)
        for server in args.servers
        for kind in (args.batch_activations if server == "quantspec" else [None])
    ]

    def get(name, level, metric):
        return figures.get((*name, level), {}).get(metric, math.nan)

    rows = []
    for level in levels:
        for name in names:
            server = name[0]
            tps = get(name, level, "serve_output_tokens_per_s")
            label = server if name[1] is None else f"{server} ({name[1]} batches)"
            row = [label, level, _f(tps), _f(tps / get(name, low, "serve_output_tokens_per_s"), 2)]
            if "llama-server" in args.servers and server == "quantspec":
                row.append(_f(tps / get(("llama-server", None), level, "serve_output_tokens_per_s"), 2))
            else:
                row.append("")
            row += [
                _f(get(name, level, "serve_ttft_ms_p99")),
                _f(get(name, level, "serve_tpot_ms_p50")),
                _f(get(name, level, "serve_errors"), 0),
            ]
            rows.append(row)
    head = [
        "server",
        "concurrency",
        "output tok/s",
        f"/ its c={low}",
        "/ llama-server",
        "TTFT p99 (ms)",
        "TPOT p50 (ms)",
        "errors",
    ]
    table = markdown_table(head, rows)
    sweep.publish(
        args.doc,
        "serving",
        "Serving under load: output tokens a second against concurrency, quantspec against llama-server",
        table,
        f"`{sweep.command}`: aiperf (closed loop at each concurrency, synthetic prompts) against each server in "
        "turns; quantspec at its precision with continuous batching on its kernels, llama-server "
        "(`--parallel <concurrency>`) on the model's own GGUF; each figure the median over its rounds.",
    )
    return sweep.returncode


def by_server_level(sweep: bench.Sweep) -> dict[tuple[str, str | None, int], dict[str, float]]:
    """{(server, its batch activations or None, concurrency): {metric: the median over its quiet rounds}} (every
    round where all were busy); the activations are quantspec's where the sweep has several, else None."""
    kinds = {job.params.get("precision.batch_activations") for job in sweep.finished}

    def key(job):
        server = job.tags.get("server", "?")
        kind = job.params.get("precision.batch_activations") if server == "quantspec" and len(kinds) > 1 else None
        return server, kind, int(float(job.params.get("task.concurrency", "0")))

    return sweep.by_key(key)


def _f(value: float, digits: int = 3) -> str:
    if math.isnan(value):
        return "–"
    if digits != 3:
        return f"{value:.{digits}f}"
    return f"{value:.0f}" if abs(value) >= 100 else f"{value:.3g}"  # 2340, not 2.34e+03


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
