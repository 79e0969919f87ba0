"""quantspec's kernel variants against each other and against ATen, op by op, timed in turns.

    .venv/bin/python -m scripts.bench_kernels                       # every variant this CPU runs, 3 rounds
    .venv/bin/python -m scripts.bench_kernels aten_isa=avx2         # ATen, oneDNN and MKL held to AVX2, as on
                                                                    # an AVX2-only host
    .venv/bin/python -m scripts.bench_kernels shapes=llama rows=1,4
    .venv/bin/python -m scripts.bench_kernels formats=w8a16,w6a16,w5a16,w4a16 variants=avx2   # the head's widths
    .venv/bin/python -m scripts.bench_kernels variants=avx2,avx_vnni_evex   # AVX-VNNI's code, EVEX-encoded
    .venv/bin/python -m scripts.bench_kernels shapes=gemma formats=w8a8,bf16 rows=512 variants=avx512   # prefill

Each round times every (shape, format, rows) on each variant and on ATen's kernel for the same weights,
one after the other in this process (a variant is switched in place), so all see the same machine
load; the table gives each median over rounds, its min-max, the GB/s of weights read, and the ratio of
ATen's time to the variant's. Each timing is one pass over copies of the weights, at least `cold_mb` MB of
them, one call each: a step reads every layer's weights once a token, from memory, and one 11008 x 4096 int4
matrix (23 MB) called again and again is read from the last-level cache (an AVX-512 EPYC's w4a16 read 56 GB/s
so, 28 from memory). cold_mb=0 times one copy, read from the caches as they hold it. With more rows than a
step (rows=512, a prefill) the quantized formats run their many-row paths: w8a8 on AMX's tiles where this CPU
has them (else ATen's int8 GEMM, as its ATen column).
"""

from __future__ import annotations

import os
import statistics
import sys
import time

from scripts import bench  # imports no torch
from src.common import benchpage  # imports no torch
from src.common.paths import cache_root
from src.common.say import say
from src.common.settings import Setting
from src.kernels.variants import ATEN_ISA  # imports no torch

SHAPES = {  # (name, N, K): a decode step's weights
    "gemma": [
        ("gemma3-270m head", 262144, 640),
        ("gemma3-270m mlp up", 2048, 640),
        ("gemma3-270m mlp down", 640, 2048),
    ],
    "llama": [("llama-2-7b mlp up", 11008, 4096), ("llama-2-7b mlp down", 4096, 11008)],
}
FORMATS = ("fp32", "bf16", "w8a8", "w8a16", "w6a16", "w5a16", "w4a16", "w4a8", "w2a16")
# by default those with an ATen kernel to time beside: ATen's side of the others unpacks in Python (~1 s a call)
DEFAULT_FORMATS = ("fp32", "bf16", "w8a8", "w8a16", "w4a16", "w4a8")


COMMAND = bench.command(
    "bench_kernels",
    __doc__,
    [
        Setting("rounds", 3, "rounds in turns"),
        Setting("repeats", 10, "timings per case (the median is kept), each a pass over the copies"),
        Setting("cold_mb", 256, "MB of copies of the weights a timing passes over (0: one copy, from the caches)"),
        Setting("shapes", tuple(SHAPES), "the weight shapes timed", choices=tuple(SHAPES)),
        Setting("formats", DEFAULT_FORMATS, "the weight formats timed", choices=FORMATS),
        Setting("rows", ("1",), "activation rows per call (1: a decode step)"),
        Setting("variants", None, "the variants timed (null: every variant this CPU runs)", tuple),
        Setting("aten_isa", None, "hold ATen, oneDNN and MKL to this ISA", choices=tuple(sorted(ATEN_ISA))),
        Setting("threads", None, "threads (null: torch's default)", int),
    ],
    takes="",
)


def main(argv: list[str]) -> int:
    args, _ = bench.parse(COMMAND, argv)
    if args.aten_isa:  # before torch is imported: its libraries read these once
        os.environ.update(ATEN_ISA[args.aten_isa])

    import torch

    from src import kernels
    from src.common.metrics import markdown_table
    from src.kernels import amx, variants
    from src.quant.formats import build, get
    from src.quant.linear import grouped_tensors, int8_tensors

    if args.threads:
        torch.set_num_threads(args.threads)
    cache = cache_root() / "kernels"
    names = args.variants or [v.name for v in kernels.candidates("auto") if v.name != "reference"]
    for name in names:  # by_name also knows avx_vnni's EVEX twin, which AVX-512 VNNI hosts can time
        if name not in variants.NAMES + (variants.AVX_VNNI_TWIN.name,):
            say(f"{name} is no kernel variant", err=True)
            return 1
        if not kernels.load_variants(cache, [variants.by_name(name)]):  # passes over what the CPU lacks
            say(f"the {name} kernels cannot run here: {kernels.reason()}", err=True)
            return 1
    no_amx = amx.enable(cache)  # w8a8's many rows on AMX's tiles where the CPU has them

    def timed(fns, x) -> float:
        """Seconds a call, the median over passes of one call to each copy."""
        for fn in fns:
            fn(x)
        times = []
        for _ in range(args.repeats):
            start = time.perf_counter()
            for fn in fns:
                fn(x)
            times.append((time.perf_counter() - start) / len(fns))
        return statistics.median(times)

    def copies(nbytes: int) -> int:
        return max(1, -(-args.cold_mb * 10**6 // nbytes)) if args.cold_mb else 1

    cases = []
    rows_of = [int(r) for r in args.rows]
    for group in args.shapes:
        for label, n, k in SHAPES[group]:
            torch.manual_seed(0)
            w = torch.randn(n, k) * 0.02
            for fmt in args.formats:
                if fmt in ("fp32", "bf16"):
                    dtype = torch.float32 if fmt == "fp32" else torch.bfloat16
                    first = w.to(dtype).contiguous()
                    nbytes = first.numel() * first.element_size()
                    held = [first] + [first.clone() for _ in range(copies(nbytes) - 1)]
                    ours = [lambda x, wt=wt: torch.ops.quantspec.gemv_float(x, wt) for wt in held]
                    aten = [lambda x, wt=wt: torch.nn.functional.linear(x, wt) for wt in held]
                else:
                    dtype = torch.float32 if fmt == "w8a8" else torch.bfloat16
                    bits = get(fmt).bits
                    t = int8_tensors(w, None) if bits == 8 else grouped_tensors(w, None, 128, bits)
                    ours, aten = [build(fmt, t, 128, dtype, gemv=True)], [build(fmt, t, 128, dtype, gemv=False)]
                    nbytes = ours[0].step_bytes()
                    for _ in range(copies(nbytes) - 1):
                        tc = {name: v.clone() for name, v in t.items()}
                        ours.append(build(fmt, tc, 128, dtype, gemv=True))
                        aten.append(build(fmt, tc, 128, dtype, gemv=False))
                    if fmt == "w8a8" and no_amx is None:
                        for fast in ours:
                            fast.prefill = "amx"
                for rows in rows_of:
                    x = torch.randn(rows, k).to(dtype)
                    cases.append((label, fmt, rows, nbytes, ours, aten, x))
            del w
    results: dict[tuple, dict[str, list[float]]] = {}
    for r in range(args.rounds):
        for label, fmt, rows, nbytes, ours, aten, x in cases:
            got = results.setdefault((label, fmt, rows, nbytes), {})
            for name in names:  # in turns: each variant, then ATen, on the same case
                kernels.load_variants(cache, [variants.by_name(name)])
                got.setdefault(name, []).append(timed(ours, x))
            got.setdefault("aten", []).append(timed(aten, x))
        print(f"round {r + 1} of {args.rounds} done", file=sys.stderr, flush=True)

    head = ["shape", "format", "rows"]
    for name in names:
        head += [f"{name} ms (min-max)", f"{name} GB/s", f"ATen / {name}"]
    head += ["ATen ms"]
    table = []
    for (label, fmt, rows, nbytes), got in results.items():
        row = [label, fmt, rows]
        aten_ms = statistics.median(got["aten"]) * 1e3
        for name in names:
            ms = [t * 1e3 for t in got[name]]
            med = statistics.median(ms)
            row += [f"{med:.3f} ({min(ms):.3f}-{max(ms):.3f})", f"{nbytes / med / 1e6:.1f}", f"{aten_ms / med:.2f}x"]
        row.append(f"{aten_ms:.3f}")
        table.append(row)
    cpu = " ".join(
        sorted(f for f in variants.cpu_features() if f.startswith(("avx512", "avx2", "avx_vnni", "fma", "amx")))
    )
    about = (
        f"threads {torch.get_num_threads()}, ATen held to {args.aten_isa or 'this CPU'}; w8a8 beyond "
        f"{kernels.MAX_ROWS} rows: {'AMX' if no_amx is None else 'ATen (' + no_amx + ')'}; CPU flags: {cpu}"
    )
    text = markdown_table(head, table)
    cold = (
        f"each timing a pass over copies of the weights, at least {args.cold_mb} MB (read from memory)"
        if args.cold_mb
        else "one copy of the weights, called again (read from the caches)"
    )
    about = f"{about}; {cold}"
    print(about)
    print(text)
    benchpage.record(
        args.doc,
        "kernels",
        f"Op by op: {', '.join(names)} against ATen{' (ATen held to ' + args.aten_isa + ')' if args.aten_isa else ''}",
        f"{about}; {args.repeats} timings a case, the median kept; each round times every "
        f"variant and ATen on a case in turns.\n\n{text}",
        rounds=args.rounds,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
