"""`engine=ort_genai`: ONNX Runtime GenAI, the runtime AMD's Ryzen AI software uses to reach the NPU.

The job's model (whatever src.models.load loaded: a cached conversion of the default model, a seed shape with
random weights, a tiny test model) is written once as a Hugging Face folder, and ONNX Runtime GenAI's own
model builder exports it, quantizing as the precision asks (its int4 and int8 are weight-only
`MatMulNBits`, round-to-nearest in blocks of 32, quantized by the builder: not quantspec's AWQ or
SmoothQuant: quantspec's int4 groups keep a float minimum, which MatMulNBits holds exactly only through
float zero points, on a path about 120x slower than its own uint4 layout: scripts/bench_ort_zero_points.py).
The export is cached under `<cache_dir>/ort_genai/<model>-<precision>-<provider>/` (ONNX +
its genai_config.json + a JSON manifest). Generation steps the runtime's own Generator one token at a
time, so each token is timestamped when it exists, as every engine's are.
"""

from __future__ import annotations

import json
import logging
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from src.engine.config import RUNTIME_NAMES
from src.engine.generation import Generation, Request
from src.engine.runtimes.exports import cached_export, exported
from src.engine.runtimes.isolated import Maker, no_crash_hint
from src.quality.scoring import score_logits

log = logging.getLogger("quantspec")
# the package's names: the Runtime's members (src.engine.config.Runtime), and what tests and scripts use
__all__ = [*RUNTIME_NAMES, "PRECISIONS", "OrtGenAI", "available", "export"]

TITLE = "ONNX Runtime GenAI"
crash_hint = no_crash_hint  # nothing known to do about a crash of its native code on a particular host


# quantspec's precision -> the builder's. Weight-only int8/int4 are what the builder offers on the CPU
# provider; bf16 runs only on CUDA there, and it quantizes no activations (w8a8).
PRECISIONS = {"fp32": "fp32", "w8a16": "int8", "w4a16": "int4", "rtn": "int4"}
# The hardware profile's device -> the execution provider the builder targets and the runtime uses.
PROVIDERS = {"cpu": "cpu", "npu": "cpu", "cuda": "cuda"}
EXPORT_VERSION = 1  # bump when the export's own steps change, so caches rebuild


def available() -> str | None:
    """Why the runtime cannot run here, or None."""
    try:
        import onnxruntime_genai  # noqa: F401
    except ImportError:
        return "onnxruntime-genai is not installed (pip install -e '.[ort]'; scripts/setup does)"
    return None


def unsupported(cfg) -> str | None:
    """Why this engine cannot run that job (a skip with its reason), or None."""
    precision = cfg.precision.name
    if precision not in PRECISIONS:
        return (
            f"engine ort_genai has no {precision}: its model builder offers weight-only int8/int4 and fp32 on "
            f"the CPU provider ({', '.join(PRECISIONS)})"
        )
    return available()


def runtime_name(cfg, device: str) -> str:
    import onnxruntime  # optional: the ort extra
    import onnxruntime_genai  # optional: the ort extra

    precision, provider = cfg.precision.name, PROVIDERS.get(device, "cpu")
    quant = {"int4": "int4 MatMulNBits", "int8": "int8 MatMulNBits", "fp32": "fp32"}[PRECISIONS[precision]]
    return (
        f"onnxruntime-genai {onnxruntime_genai.__version__} (onnxruntime {onnxruntime.__version__}), "
        f"{provider} provider, {quant} (the builder's)"
    )


def export(model, tokenizer, source_key: str, precision: str, provider: str, cache_dir: Path) -> Path:
    """The model as ONNX Runtime GenAI runs it: built once per (weights, precision, provider), then cached."""
    import onnxruntime_genai  # optional: the ort extra

    key = f"{source_key}-{PRECISIONS[precision]}-{provider}"
    want = {
        "version": EXPORT_VERSION,
        "builder": onnxruntime_genai.__version__,
        "source": source_key,
        "precision": PRECISIONS[precision],
        "provider": provider,
    }
    return cached_export(
        Path(cache_dir) / "ort_genai" / key,
        want,
        model,
        tokenizer,
        lambda work: [
            sys.executable,
            "-m",
            "src.engine.runtimes.ort_genai.builder",
            "-i",
            str(work / "hf"),
            "-o",
            str(work / "model"),
            "-p",
            PRECISIONS[precision],
            "-e",
            provider,
            "-c",
            str(work / "cache"),
        ],
        f"ONNX Runtime GenAI ({PRECISIONS[precision]}, {provider} provider)",
    )


def build(cfg, loaded, placement, corpus, recorder):
    """The job's weights exported at the precision (cached), run on the provider the hardware profile names
    where it is here, else on the CPU provider, said; returned as what loads it (in the runtime's own process)."""
    provider = PROVIDERS.get(placement.device, "cpu")
    if cfg.hardware.device == "npu":
        log.warning(
            "%s profile: the Ryzen AI provider is not in this onnxruntime-genai; the CPU provider runs",
            cfg.hardware.name,
        )
    folder = exported(
        recorder,
        lambda: export(loaded.model, loaded.tokenizer, loaded.source_key, cfg.precision.name, provider, cfg.cache_dir),
        "onnxruntime",
        f"onnxruntime-genai/{provider}",
    )
    return Maker(
        "src.engine.runtimes.ort_genai.runtime:OrtGenAI",
        folder,
        provider,
        int(getattr(loaded.model.config, "sliding_window", 0) or 0),
    )


@dataclass
class OrtGenAI:
    """The engine: called as every engine is (the torch model is ignored: the runtime holds its own)."""

    folder: Path
    provider: str
    window: int = 0  # a sliding window: the runtime wants its KV cache at least this long

    def __post_init__(self):
        import onnxruntime_genai as og  # optional: the ort extra

        config = og.Config(str(self.folder))
        if self.provider != "cpu":
            config.clear_providers()
            config.append_provider(self.provider)
        self.model = og.Model(config)
        genai = json.loads((self.folder / "genai_config.json").read_text())
        self.context = int(genai["model"].get("context_length", 0) or 0)

    def window_score(self, ids, indices=None):
        """The window scored from the runtime's own logits for every position of one prompt
        (src.quality.scoring, as for torch models)."""
        import onnxruntime_genai as og  # optional: the ort extra

        params = og.GeneratorParams(self.model)
        params.set_search_options(
            max_length=max(len(ids), self.window) if not self.context else min(max(len(ids), self.window), self.context)
        )
        generator = og.Generator(self.model, params)
        generator.append_tokens(ids.tolist())
        logits = torch.from_numpy(np.asarray(generator.get_output("logits"), dtype=np.float32)[0])
        return score_logits(logits, ids, indices)

    def __call__(self, model, request: Request) -> Generation:
        input_ids, max_new_tokens, exact, sampling, pad_token_id, stop = request
        import onnxruntime_genai as og  # optional: the ort extra

        ids = input_ids[0].tolist()
        params = og.GeneratorParams(self.model)
        length = max(len(ids) + max_new_tokens, self.window)
        if self.context:
            length = min(length, self.context)
        options = dict(max_length=length, do_sample=sampling.do_sample)
        if sampling.do_sample:
            options.update(temperature=sampling.temperature, top_p=sampling.top_p, random_seed=sampling.seed)
        if exact:  # as min_new_tokens does for the other engines: no end-of-sequence before the last token
            options["min_length"] = len(ids) + max_new_tokens
        params.set_search_options(**options)
        generator = og.Generator(self.model, params)
        start = time.perf_counter()
        generator.append_tokens(ids)
        new, times = [], []
        while len(new) < max_new_tokens and not generator.is_done():
            generator.generate_next_token()
            times.append(time.perf_counter())
            new.append(int(generator.get_next_tokens()[0]))
            if stop is not None and stop(new):
                break
        end = time.perf_counter()
        return Generation(len(ids), new, start, times, end)
