"""quantspec's decode on a GPU (or any device) beside transformers' generate, in turns, one JSON line per result.

    python -m scripts.bench_gpu                                   # cuda, llama-2-7b random weights, every phase
    python -m scripts.bench_gpu device=cpu tiny=true              # the smoke CI runs: a tiny model, no compiling
    python -m scripts.bench_gpu precisions=bf16,w4a16 phases=static,hf_compiled deadline=300

Each precision's model is made once on the device (random weights at the model's published shape, or the tiny
llama; quantized by round to nearest from the same tensors a job's would be, then built for the device:
src.quant.linear), then every phase decodes the same prompt in turns, `rounds` times:

- python: the native engine's Python layer loop (engine.step_path=python: quantspec's GPU path before the
  static step);
- static: the static step (src.engine.static_step), a CUDA graph per k where the device has graphs, else eager;
- static_compiled: the same through torch.compile (engine.compile=true);
- hf_eager: transformers' generate (float precisions only);
- hf_compiled: generate with a static cache and its forward through torch.compile(mode="reduce-overhead",
  fullgraph=True): transformers' fastest (float precisions only).

A phase is warmed once (graphs captured, compiled) before its first timed run. Time per token is the decode's
wall time over its tokens after the first (quantspec reads every token back, so each timestamp waits for the
device; generate is timed as the difference of a `new`-token and a 1-token call). The limit is the weights'
bytes over the device's copy bandwidth (src.engine.roofline's probe). Every result is printed and appended
to `out` as one JSON line the moment it exists: a run cut short keeps what it measured. Each phase has
`phase_s` seconds (its warm-up included) and the whole run `deadline`; a phase out of time is said and skipped.
It imports no MLflow and no Hydra: a GPU machine needs torch, transformers and this repository only.
"""

from __future__ import annotations

import contextlib
import json
import signal
import statistics
import sys
import time
from pathlib import Path

import torch

from src.common.settings import Command, Setting, SettingError
from src.engine import native, roofline, static_step
from src.engine.generation import Request, Sampling
from src.models.random_weights import random_model
from src.models.tiny import tiny_model
from src.quant.methods import Rtn
from src.quant.pipeline import install, quantize

PHASES = ("python", "static", "static_compiled", "hf_eager", "hf_compiled")
FLOAT = {"fp32": torch.float32, "bf16": torch.bfloat16}
QUANTIZED = {"w8a16": torch.bfloat16, "w4a16": torch.bfloat16, "w8a8": torch.float32}  # conf/precision's dtypes
COMMAND = Command(
    "python -m scripts.bench_gpu",
    __doc__,
    [
        Setting("device", "cuda", "the torch device: cuda, or cpu for the smoke"),
        Setting("tiny", False, "the tiny llama (src.models.tiny) instead of `model`"),
        Setting("model", "llama-2-7b", "a shipped shape (src.models.random_weights), random weights"),
        Setting("precisions", ("bf16", "fp32", "w8a16", "w4a16", "w8a8"), "precisions, each a model on the device"),
        Setting("phases", PHASES, "what decodes (see above)", choices=PHASES),
        Setting("prompt", 128, "prompt tokens"),
        Setting("new", 64, "new tokens per decode"),
        Setting("rounds", 3, "timed runs of each phase, in turns"),
        Setting("phase_s", 240.0, "seconds one phase may take at once (warm-up and compiling included)"),
        Setting("deadline", 540.0, "seconds for the whole run; what is left when it passes is skipped"),
        Setting("out", "reports/bench_gpu.jsonl", "the JSON lines, appended"),
    ],
)


class OutOfTime(Exception):
    pass


@contextlib.contextmanager
def limit(seconds: float):
    """Raise OutOfTime in this (the main) thread after `seconds`: a compile that runs away is stopped."""

    def ring(*_):
        raise OutOfTime

    previous = signal.signal(signal.SIGALRM, ring)
    signal.setitimer(signal.ITIMER_REAL, max(seconds, 0.001))
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def make_models(args, device: str) -> dict[str, torch.nn.Module]:
    """Each precision's model on the device, made from one bf16 random (or tiny fp32) model's weights."""

    def base():
        if args.tiny:
            model, _ = tiny_model("llama")
            return model.to(device)
        model, _ = random_model(args.model, device=device)
        return model

    models = {}
    for name in args.precisions:
        model = base()
        if name in FLOAT:
            models[name] = model.to(FLOAT[name]).eval()
        elif name in QUANTIZED:
            spec = Rtn(
                method="rtn",
                format=name,
                group_size=128,
                quantize_head=True,
                head_format=None,
                wide_linears=(),
                wide_format="w8a16",
                gptq=(),
                gptq_wide=True,
                calib_inputs="rounded",
            )
            weights = quantize(model, model.config.model_type, spec, None)
            models[name] = install(model.to(QUANTIZED[name]), weights, QUANTIZED[name], device=device).eval()
        else:
            raise SettingError(
                f"precisions={name} is not one bench_gpu makes; it makes {', '.join([*FLOAT, *QUANTIZED])}"
            )
        if device == "cuda":
            torch.cuda.empty_cache()
    return models


def quantspec(model, ids, new: int, phase: str) -> tuple[list[int], float, float]:
    """(tokens, prefill ms, ms per token after the first) of the native engine on `phase`'s path."""
    if phase == "python":
        out = native.generate(model, Request(ids, new, True, Sampling(), None), path="python")
    else:
        out = static_step.generate(model, Request(ids, new, True, Sampling(), None), compile=phase == "static_compiled")
    per_token = (out.token_times[-1] - out.token_times[0]) / (len(out.token_times) - 1) * 1e3
    return out.new_token_ids, (out.token_times[0] - out.start) * 1e3, per_token


def transformers_generate(model, ids, new: int, device: str) -> tuple[list[int], float, float]:
    def run(n):
        start = time.perf_counter()
        out = model.generate(ids, max_new_tokens=n, min_new_tokens=n, do_sample=False, pad_token_id=0)
        if device == "cuda":
            torch.cuda.synchronize()
        return out[0, ids.shape[1] :].tolist(), time.perf_counter() - start

    _, first = run(1)
    tokens, total = run(new)
    return tokens, first * 1e3, (total - first) / (new - 1) * 1e3


def compiled_for_generate(model):
    """generate with a static cache, the forward compiled as transformers documents it."""
    model.generation_config.cache_implementation = "static"
    model.forward = torch.compile(model.forward, mode="reduce-overhead", fullgraph=True)
    return model


def main(argv: list[str]) -> int:
    if {"-h", "--help"} & set(argv):
        print(COMMAND.usage())
        return 0
    try:
        values, _ = COMMAND.parse(argv)
    except SettingError as err:
        print(f"quantspec: {err}", file=sys.stderr)
        return 2
    args = type("Args", (), values)
    begun = time.monotonic()
    device = args.device
    if device == "cuda" and not torch.cuda.is_available():
        print(
            "quantspec: device=cuda and this torch sees no CUDA device; run with device=cpu tiny=true", file=sys.stderr
        )
        return 2
    out_path = Path(args.out)
    out_path.parent.mkdir(parents=True, exist_ok=True)
    head = {
        "device": torch.cuda.get_device_name() if device == "cuda" else "cpu",
        "torch": torch.__version__,
        "model": "tiny-llama" if args.tiny else args.model,
    }
    results: list[dict] = []

    def emit(record: dict) -> None:
        record = {**head, **record}
        print(json.dumps(record), flush=True)
        with out_path.open("a") as f:
            f.write(json.dumps(record) + "\n")
        results.append(record)

    torch.manual_seed(0)
    models = make_models(args, device)
    probe = roofline.Probe(
        torch.get_num_threads(), roofline.DEVICE_PROBE_MB if device == "cuda" else 256, device=device
    )
    bandwidth = probe()
    emit({"kind": "bandwidth", "gbs": bandwidth, "spread": probe.spreads[-1]})
    vocab = next(iter(models.values())).config.vocab_size
    ids = torch.randint(3, vocab, (1, args.prompt), generator=torch.Generator().manual_seed(0)).to(device)
    phases = {p: [] for p in args.phases}
    warmed: set[tuple[str, str]] = set()
    for round_ in range(1, args.rounds + 1):
        for name, model in models.items():
            limit_ms = roofline.weight_bytes(model) / (bandwidth * 1e9) * 1e3
            for phase in phases:
                if phase.startswith("hf") and name not in FLOAT:
                    continue
                left = args.deadline - (time.monotonic() - begun)
                if left <= 0:
                    emit({"kind": "skipped", "phase": phase, "precision": name, "why": "deadline"})
                    continue
                try:
                    with limit(min(args.phase_s, left)), torch.inference_mode():
                        if (name, phase) not in warmed:
                            if phase == "hf_compiled":
                                models[name] = model = compiled_for_generate(model)
                            run_phase(model, ids, args.new, phase, device)  # graphs captured, compiled
                            warmed.add((name, phase))
                        tokens, prefill_ms, ms = run_phase(model, ids, args.new, phase, device)
                except OutOfTime:
                    emit({"kind": "skipped", "phase": phase, "precision": name, "why": f"over {args.phase_s:.0f} s"})
                    continue
                except Exception as err:  # noqa: BLE001 - one phase's failure is reported; the others go on
                    line = str(err).splitlines()[0][:200] if str(err) else ""
                    emit({"kind": "failed", "phase": phase, "precision": name, "why": f"{type(err).__name__}: {line}"})
                    continue
                emit(
                    {
                        "kind": "decode",
                        "phase": phase,
                        "precision": name,
                        "round": round_,
                        "prefill_ms": prefill_ms,
                        "ms_per_token": ms,
                        "tokens_per_s": 1e3 / ms,
                        "limit_ms": limit_ms,
                        "of_limit": limit_ms / ms,
                        "tokens": tokens,
                    }
                )
    print(summary(results), flush=True)
    return 0


def run_phase(model, ids, new: int, phase: str, device: str):
    if phase.startswith("hf"):
        return transformers_generate(model, ids, new, device)
    return quantspec(model, ids, new, phase)


def summary(results: list[dict]) -> str:
    """Medians per precision and phase, with the ratios the GPU issue asks for: each against transformers'
    compiled generate, against the copy-bandwidth limit, fp32 over bf16, and w4a16's tokens/s over bf16's."""
    decoded = [r for r in results if r["kind"] == "decode"]
    med: dict[tuple[str, str], float] = {}
    for key in {(r["precision"], r["phase"]) for r in decoded}:
        med[key] = statistics.median(r["ms_per_token"] for r in decoded if (r["precision"], r["phase"]) == key)
    lines = ["precision  phase            ms/token  of limit  vs hf_compiled  tokens = python's"]
    for (precision, phase), ms in sorted(med.items()):
        limit_ms = next(r["limit_ms"] for r in decoded if r["precision"] == precision)
        hf = med.get((precision, "hf_compiled"))
        same = {tuple(r["tokens"]) for r in decoded if r["precision"] == precision and r["phase"] in ("python", phase)}
        lines.append(
            f"{precision:<10} {phase:<16} {ms:8.2f}  {limit_ms / ms:8.2f}  "
            f"{(f'{ms / hf:.2f}x' if hf else '-'):>14}  {'yes' if len(same) == 1 else 'no'}"
        )
    for best in ("static", "static_compiled"):
        bf16, fp32, w4 = (med.get((p, best)) for p in ("bf16", "fp32", "w4a16"))
        if bf16 and fp32:
            lines.append(f"{best}: fp32 / bf16 time per token {fp32 / bf16:.2f} (fp32 must not be faster: >= 1)")
        if bf16 and w4:
            lines.append(f"{best}: w4a16 tokens/s over bf16's {bf16 / w4:.2f}")
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
