"""The seeds' 7B decoding and prefilling beside llama.cpp's llama-bench on the same weights, timed in turns.

    .venv/bin/python -m scripts.bench_seven_b_decode                      # 3 rounds
    .venv/bin/python -m scripts.bench_seven_b_decode rounds=5 doc=true    # the table on the llama.cpp page

The weights are scripts/bench_seven_b's, written once under the cache: a local checkpoint of random bf16 weights at
the model's published shape and an F16 GGUF of the same weights; here also, once, its Q4_K_M by `llama-quantize`.
Each round, in turns: quantspec's job as a user runs it, `python -m src.run model=hub model.local_path=<checkpoint>
precision=w4a16 precision.prefill_activations=<each> task=benchmark_long 'task.prompt_lengths=[128,512]'
task.max_new_tokens=16` (its prefill at each length and the time per new token after the 128-token prompt, read back
from its run; a job for each of `prefill_activations`, bf16 and int8 unless told; its first run quantizes the
checkpoint, as bench_seven_b times: AWQ and GPTQ, ~8 minutes on a 2-core AVX-512 EPYC, cached after), then
`llama-bench -p 128,512 -n 16` (`llama_bench=`: another build, e.g. one for AVX2 only beside `isa=avx2 aten_isa=avx2`, as on an AVX2 host) on the Q4_K_M (its pp128, pp512 and tg16, timed by the C++ tool itself, on as many
threads). quantspec's decode starts after 128 tokens of context and llama-bench's tg16 after none: a 7B step's KV
reads at 128 tokens are ~2% of its weights'. The table: each figure's median over the rounds, its min-max, and
quantspec's time over llama-bench's.
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from scripts import bench
from scripts.bench_seven_b import random_weights
from scripts.peer import cache_dir, long_job
from src.common.metrics import markdown_table
from src.common.say import say
from src.common.settings import Setting
from src.kernels.variants import ATEN_ISA

LENGTHS = (128, 512)  # prompt tokens prefilled (llama-bench's pp128, pp512)
TOKENS = 16  # new tokens decoded (llama-bench's tg16)

COMMAND = bench.command(
    "bench_seven_b_decode",
    __doc__,
    [
        Setting("model", "llama-2-7b", "a shipped shape (src/shapes/) of the llama family"),
        Setting("rounds", 3, "rounds in turns"),
        Setting("threads", 2, "threads on both sides"),
        Setting("isa", "auto", "quantspec's engine.isa (its kernel variant)"),
        Setting("aten_isa", None, "hold the jobs' ATen, oneDNN and MKL to this ISA", choices=tuple(sorted(ATEN_ISA))),
        Setting("llama_bench", None, "the llama-bench to time (default: the cache's build; an AVX2 one for isa=avx2)"),
        Setting(
            "prefill_activations",
            ("bf16", "int8"),
            "quantspec's precision.prefill_activations, one job each in every round's turns",
            choices=("bf16", "int8"),
        ),
    ],
    takes="",
)


def llama_bench(exe: Path, gguf: Path, threads: int) -> dict[str, float]:
    """{"pp128": ms, "pp512": ms, "tg16": ms a token} of one llama-bench run (one repetition each)."""
    prompts = ",".join(map(str, LENGTHS))
    cmd = [str(exe), "-m", str(gguf), "-p", prompts, "-n", str(TOKENS), "-r", "1", "-t", str(threads), "-o", "json"]
    done = subprocess.run(cmd, capture_output=True, text=True, check=True)
    found = {}
    for test in json.loads(done.stdout):
        if test["n_gen"]:
            found[f"tg{test['n_gen']}"] = 1e3 / test["avg_ts"]
        else:
            found[f"pp{test['n_prompt']}"] = test["n_prompt"] * 1e3 / test["avg_ts"]
    return found


def main(argv: list[str]) -> int:
    args, _ = bench.parse(COMMAND, argv)
    cache = cache_dir()
    tools = cache / "tools" / "llama.cpp"
    bench_exe, quantizer = tools / "bin" / "llama-bench", tools / "bin" / "llama-quantize"
    if args.llama_bench is not None:
        bench_exe = Path(args.llama_bench)
    vocab = tools / "ggml-vocab-llama-spm.gguf"
    if not bench_exe.is_file() or not quantizer.is_file() or not vocab.is_file():
        say(f"no llama-bench, llama-quantize or vocabulary in {tools}: `bash scripts/build_llama_server`", err=True)
        return 2
    home = cache / "seven_b"
    folder, f16 = random_weights(args.model, home, vocab)
    q4 = home / f"{args.model}-random-q4_k_m.gguf"
    if not q4.is_file():
        print(f"writing {q4}", flush=True)
        partial = q4.with_suffix(".partial")
        subprocess.run([str(quantizer), str(f16), str(partial), "Q4_K_M"], capture_output=True, check=True)
        partial.rename(q4)
    store = f"sqlite:///{tempfile.mkdtemp(prefix='bench-seven-b-decode-store-')}/mlflow.db"
    job = ["model=hub", f"model.local_path={folder}", "precision=w4a16", f"hardware.threads={args.threads}"]
    job.append(f"engine.isa={args.isa}")
    env = ATEN_ISA[args.aten_isa] if args.aten_isa else {}
    kinds = list(dict.fromkeys(args.prefill_activations))
    figures = ["decode ms/token", *(f"prefill {n} ms" for n in LENGTHS)]
    ours: dict[str, dict[str, list[float]]] = {kind: {f: [] for f in figures} for kind in kinds}
    theirs: dict[str, list[float]] = {f: [] for f in figures}
    for r in range(args.rounds):
        for kind in kinds:
            got = long_job(store, [*job, f"precision.prefill_activations={kind}"], list(LENGTHS), TOKENS, env)
            ours[kind]["decode ms/token"].append(got[LENGTHS[0]][1])
            for n in LENGTHS:
                ours[kind][f"prefill {n} ms"].append(got[n][0])
        peer = llama_bench(bench_exe, q4, args.threads)
        theirs["decode ms/token"].append(peer[f"tg{TOKENS}"])
        for n in LENGTHS:
            theirs[f"prefill {n} ms"].append(peer[f"pp{n}"])
        said = "; ".join(
            f"{f} {', '.join(f'{ours[k][f][-1]:.1f} ({k})' for k in kinds)} against {theirs[f][-1]:.1f}"
            for f in figures
        )
        print(f"round {r + 1}: {said}", flush=True)

    def cell(values: list[float]) -> str:
        return f"{statistics.median(values):.1f} ({min(values):.1f}-{max(values):.1f})"

    rows = [
        [
            f,
            *(cell(ours[k][f]) for k in kinds),
            cell(theirs[f]),
            *(statistics.median(ours[k][f]) / statistics.median(theirs[f]) for k in kinds),
        ]
        for f in figures
    ]
    table = markdown_table(
        [
            "figure",
            *(f"quantspec w4a16, {k} prefill (median, min-max)" for k in kinds),
            f"llama-bench Q4_K_M (tg{TOKENS}, pp)",
            *(f"{k} x llama-bench" for k in kinds),
        ],
        rows,
    )
    about = (
        f"{args.model}'s shape, random weights on both sides (quantspec: the default w4a16 mix from a bf16 checkpoint, "
        f"precision.prefill_activations={','.join(kinds)}; llama.cpp: Q4_K_M by llama-quantize from an F16 GGUF of the "
        f"same weights; llama-bench {'as llama_bench= gave it' if args.llama_bench else 'of scripts/build_llama_server'}), "
        f"{args.threads} threads, engine.isa={args.isa}, ATen {args.aten_isa or 'native'}, {args.rounds} rounds in turns; "
        "quantspec's decode after a "
        f"{LENGTHS[0]}-token prompt (its decode steps take 16-bit activations either way), llama-bench's after none."
    )
    bench.publish(
        args.doc,
        "llamacpp",
        f"{args.model}'s shape: decode and prefill against llama-bench",
        table,
        about,
        bench.stamp("seven-b-decode"),
        rounds=args.rounds,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
