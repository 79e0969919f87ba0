"""Where one decode step's time goes, per precision, on the engine a sweep runs (quantspec's kernels and step path).

    .venv/bin/python -m scripts.bench_step                          # gemma3-270m, every precision
    .venv/bin/python -m scripts.bench_step precisions=w4a16 steps=40
    .venv/bin/python -m scripts.bench_step paths=python,cpp            # the Python step loop beside the C++ one
    .venv/bin/python -m scripts.bench_step model=llama-160m model.weights=random    # a draft's shape

Each precision's job is built as a sweep builds it (src.assembly.job.build) and stepped one token at a time
after a 64-token prompt. The step's wall time (median over `steps`, the precisions in turns over `rounds`) is
split, from torch.profiler's self time of every operator in a profiled run of the same steps, into:

- weights: the matmul kernels that stream the weights (quantspec's gemv/linear ops, ATen's mm), less the head;
- head: the output projection over the whole vocabulary, timed alone on the step's last hidden state;
- attention and KV cache: the attention kernel and the cache's update;
- norms, rotary, activations: every other operator (elementwise maths, copies, the embedding);
- sampling: the greedy choice over the step's logits as the engines make it (src.engine.generation.choose), alone
  (0 where the C++ step takes the argmax itself: its time is then inside the step's);
- framework: what is left of the profiled run's wall time, spent between operators (Python, the dispatcher).

Each figure is the median over the rounds; within a round the parts come from one profiled run and the
token's time from an unprofiled one just before it, so they need not add up exactly on a noisy host.

The fixed cost per token is the step's time less the weights' and the head's (what a token costs whatever
its weights weigh), and the roofline is the weights' bytes over the host's probed bandwidth
(src.engine.roofline). Operators per step are the top-level calls the profiler saw. Printed with the host's
CPU flags; doc=true appends the table to docs/benchmarks/engine.md.
"""

from __future__ import annotations

import statistics
import sys
import time
from collections import defaultdict

import torch
from torch.profiler import ProfilerActivity, profile

from scripts import bench
from scripts.bench import median_time
from scripts.jobs import build_job
from src import kernels
from src.common import benchpage
from src.common.metrics import markdown_table
from src.common.say import say
from src.common.settings import Setting
from src.engine import roofline
from src.engine.generation import Sampling, choose
from src.engine.native import Decoder
from src.tasks.benchmark import cut_prompts

GREEDY = Sampling()
BANNED = torch.tensor([], dtype=torch.long)
PRECISIONS = ["fp32", "bf16", "w8a8", "w8a16", "w4a16"]
PARTS = ("weights", "head", "attention and KV cache", "norms, rotary, activations", "sampling", "framework")
MATMULS = ("aten::mm", "aten::addmm", "aten::_weight_int8pack_mm", "aten::_weight_int4pack_mm", "aten::_int_mm")
WEIGHT_OPS = ("gemv", "gemm", "linear")  # quantspec's ops that stream a weight (rms_norm and attention do not)
ATTENTION = (
    "quantspec::decode_attention",
    "aten::scaled_dot_product_attention",
    "aten::_scaled_dot_product",
    "aten::cat",
    "aten::index_copy",
    "aten::bmm",
    "aten::_softmax",
)


def category(name: str) -> str:
    if name.startswith(ATTENTION):
        return "attention and KV cache"
    if name.startswith(MATMULS) or (name.startswith("quantspec::") and any(k in name for k in WEIGHT_OPS)):
        return "weights"
    return "norms, rotary, activations"


class Stepper:
    """One precision's job on one step path, prefilled once; each measurement steps one token and rolls it
    back. Step paths of one precision share its job (its model)."""

    def __init__(self, job, precision: str, path: str):
        self.precision, self.path, self.job = precision, path, job
        prompt = cut_prompts(self.job.loaded.tokenizer, self.job.corpus.reader("evaluation")(), [64])[0]
        self.token = int(prompt[0, -1])
        self.decoder = Decoder(self.job.model, path)
        self.decoder.prefill(prompt[:, :-1])
        dtype = self.job.model.get_input_embeddings().weight.dtype  # what the final norm hands the head
        self.hidden = torch.randn(1, 1, self.job.model.config.hidden_size).to(dtype)

    def step(self) -> torch.Tensor | int:
        """One greedy token as the decode task takes it: where the C++ step computes the head, its argmax is
        taken there (Decoder.greedy_step) and the choice costs nothing apart; else the step's logits."""
        chosen = self.decoder.greedy_step(self.token, BANNED)
        out = self.decoder.step(self.token) if chosen is None else chosen
        self.decoder.rollback(1)
        return out

    def wall_ms(self, steps: int) -> float:
        return median_time(self.step, steps) * 1e3

    def head_ms(self, steps: int) -> float:
        head = self.job.model.lm_head
        return median_time(lambda: head.forward(self.hidden), steps) * 1e3

    def sampling_ms(self, steps: int) -> float:
        logits = self.step()
        if isinstance(logits, int):  # chosen inside the step, its time in the step's
            return 0.0
        return median_time(lambda: choose(logits, GREEDY, None), steps) * 1e3  # as the engines pick a token

    def profiled(self, steps: int) -> tuple[dict[str, float], float]:
        """ms per step of each part by the operators' self time, what is left of the profiled wall time
        (framework), and the top-level operators per step."""
        self.step()
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            start = time.perf_counter()
            for _ in range(steps):
                self.step()
            wall = (time.perf_counter() - start) * 1e3 / steps
        parts: dict[str, float] = defaultdict(float)
        top = 0
        for event in prof.events():
            if event.cpu_parent is None:
                top += 1
            parts[category(event.name)] += event.self_cpu_time_total / 1e3 / steps
        parts["framework"] = max(0.0, wall - sum(parts.values()))
        parts["wall"] = wall
        return dict(parts), top / steps


def measure(s: Stepper, steps: int) -> dict[str, float]:
    """One round of one precision: the token's time unprofiled, then its parts from a profiled run of the
    same steps, the head and the choice of a token timed alone. The fixed cost is the profiled step less the
    time of the operators that stream weights (the head's included), plus the choice: what a token costs
    whatever its weights weigh, within one measurement."""
    token = s.wall_ms(steps)
    parts, ops = s.profiled(steps)
    head, sampling = s.head_ms(steps), s.sampling_ms(steps)
    streamed = parts.get("weights", 0.0)
    return {
        "token": token + sampling,
        "weights": max(0.0, streamed - head),
        "head": head,
        "attention and KV cache": parts.get("attention and KV cache", 0.0),
        "norms, rotary, activations": parts.get("norms, rotary, activations", 0.0),
        "sampling": sampling,
        "framework": parts["framework"],
        "fixed": parts["wall"] - streamed + sampling,
        "ops": ops,
    }


@torch.inference_mode()
def breakdown(precisions: list[str], paths: list[str], steps: int, rounds: int, overrides: list[str]) -> str:
    steppers = []
    for p in precisions:
        job = build_job(p, *overrides)
        steppers += [Stepper(job, p, path) for path in paths]
    if not kernels.loaded():
        say(f"quantspec kernels unavailable here ({kernels.reason()}): the step runs ATen's")
    found: dict[tuple[str, str], list[dict[str, float]]] = defaultdict(list)
    probe = roofline.Probe(torch.get_num_threads())
    for r in range(rounds):  # in turns: every precision sees the same machine load
        for s in steppers:
            found[s.precision, s.path].append(measure(s, steps))
            # each timing's roofline at the bandwidth probed right after it
            timed = found[s.precision, s.path][-1]
            timed["roofline"] = roofline.roofline_ms(s.job.model, 64, probe())
            timed["efficiency"] = timed["roofline"] / timed["token"]
            token = timed["token"]
            say(f"round {r + 1}: {s.precision} ({s.path}): token {token:.2f} ms")
    rows = []
    for s in steppers:
        runs = found[s.precision, s.path]
        median = {k: statistics.median(m[k] for m in runs) for k in runs[0]}
        rows.append(
            [
                s.precision,
                s.path,
                median["token"],
                *(median[p] for p in PARTS),
                median["fixed"],
                median["ops"],
                median["roofline"],
                median["efficiency"],
            ]
        )
    return markdown_table(
        [
            "precision",
            "step path",
            "token (ms)",
            *(f"{p} (ms)" for p in PARTS),
            "fixed cost (ms)",
            "ops/step",
            "roofline (ms)",
            "efficiency",
        ],
        rows,
    )


COMMAND = bench.command(
    "bench_step",
    __doc__,
    [
        Setting("precisions", tuple(PRECISIONS), "the precisions, in turns"),
        Setting("paths", ("cpp",), "engine.step_path values to set side by side (cpp,python)"),
        Setting("steps", 30, "steps per timing"),
        Setting("rounds", 3, "rounds of the precisions in turns"),
    ],
)


def main(argv: list[str]) -> int:
    args, overrides = bench.parse(COMMAND, argv)  # overrides: for every job (model=llama-160m model.weights=random)
    table = breakdown(list(args.precisions), list(args.paths), args.steps, args.rounds, overrides)
    model = next((o.split("=", 1)[1] for o in overrides if o.startswith("model=")), "gemma3-270m")
    extra = f", {' '.join(overrides)}" if overrides else ""
    title = f"One decode step of {model}, where its time goes ({torch.get_num_threads()} threads{extra})"
    print(f"\n{title}; CPU flags: {' '.join(benchpage.host_flags())}\n\n{table}")
    benchpage.record(args.doc, "engine", title, table, rounds=args.rounds)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
