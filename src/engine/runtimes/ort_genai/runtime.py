"""`engine=ort_genai`: ONNX Runtime GenAI, the runtime AMD's Ryzen AI software uses to reach the NPU.

The job's model (whatever src.models.load loaded: a cached conversion of the default model, a seed shape with
random weights, a tiny test model) is written once as a Hugging Face folder, and ONNX Runtime GenAI's own
model builder exports it, quantizing as the precision is (`target`, from src.engine.runtimes.recipe: never its
name). Its int4 and int8 are weight-only `MatMulNBits`, rounded to nearest by the builder, asymmetric, in the
precision's groups as blocks (a per-channel int8 in its largest, 256), the activations at the precision's bits
(accuracy level 1, fp32, for 16-bit ones; 4, int8, for w4a8), the head int8 or as the layers are. What it
cannot express (AWQ's or SmoothQuant's scales, GPTQ, 5- and 6-bit weights, named linears kept wider) is refused
in one line naming the field. (quantspec's int4 groups keep a float minimum, which MatMulNBits holds exactly only
through float zero points, on a path about 120x slower than its own uint4 layout: scripts/bench_ort_zero_points.py;
so the builder rounds the float weights itself.) The export is cached under
`<cache_dir>/ort_genai/<model>-<target>-<provider>/` (ONNX +
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
from src.engine.runtimes import recipe
from src.engine.runtimes.exports import cached_export, exported
from src.engine.runtimes.isolated import Maker, no_crash_hint
from src.engine.runtimes.recipe import Inexpressible, Recipe
from src.quality.scoring import score_logits

log = logging.getLogger("quantspec")
# the package's names: the Runtime's members (src.engine.config.Runtime), and what tests and scripts use
__all__ = [*RUNTIME_NAMES, "OrtGenAI", "available", "export", "target"]

TITLE = "ONNX Runtime GenAI"
crash_hint = no_crash_hint  # nothing known to do about a crash of its native code on a particular host


# The hardware profile's device -> the execution provider the builder targets and the runtime uses.
PROVIDERS = {"cpu": "cpu", "npu": "cpu", "cuda": "cuda"}
EXPORT_VERSION = 2  # bump when the export's own steps change, so caches rebuild (2: the target from the recipe)
BLOCKS = (16, 32, 64, 128, 256)  # the builder's MatMulNBits block sizes


def target(r: Recipe) -> dict:
    """The model builder's precision and extra options for what the precision is (src.engine.runtimes.recipe), or
    Inexpressible saying, in one line, which field the builder cannot express. Its int4 and int8 are weight-only
    MatMulNBits, rounded to nearest in blocks (asymmetric here, as quantspec's groups are); its accuracy level is the
    activations' (1: fp32, 4: int8 per block, the CPU provider's default, which w4a16 does not ask); the head int8
    (last_matmul) or as the layers are."""
    if r.layers is None:
        if r.dtype != "float32":
            raise Inexpressible(
                f"engine ort_genai has no precision.dtype={r.dtype} on the CPU provider (its bf16 runs only on "
                f"CUDA); use precision=fp32"
            )
        return {"precision": "fp32", "options": {}}
    if r.method != "rtn":
        raise Inexpressible(
            f"engine ort_genai's model builder rounds to nearest, with no {r.method} scales: precision.method="
            f"{r.method}; use precision.method=rtn"
        )
    recipe.refuse_gptq_and_bits(r, "ort_genai", "model builder rounds to nearest")
    if r.wide_linears:
        raise Inexpressible(
            f"engine ort_genai's model builder keeps no named linears wider (its mixed precision picks its own): "
            f"precision.wide_linears={list(r.wide_linears)}; set precision.wide_linears=[]"
        )
    layers = r.layers
    if layers.bits == 8 and layers.act_bits == 8:
        raise Inexpressible(
            f"engine ort_genai has no int8 activations beside int8 weights: {layers.field}={layers.name}"
        )
    block = layers.group or max(BLOCKS)  # int8 per output channel: the builder's largest block (finer, not coarser)
    if block not in BLOCKS:
        raise Inexpressible(f"engine ort_genai's blocks are {BLOCKS}: precision.group_size={layers.group}")
    options = {"block_size": block, "is_symmetric": False, "accuracy_level": 4 if layers.act_bits == 8 else 1}
    if r.head is None:
        options["nodes_to_exclude"] = "/lm_head/MatMul"
    elif r.head.bits != layers.bits or r.head.act_bits != layers.act_bits:
        if r.head.bits != 8 or layers.bits != 4:
            raise Inexpressible(f"engine ort_genai's head is the layers' format or int8: {r.head.field}={r.head.name}")
        options["matmul_mixed_precision"] = "last_matmul:int8"
    return {"precision": f"int{layers.bits}", "options": options}


def _label(t: dict) -> str:
    """The target in a few characters: the export's cache folder and manifest name it."""
    o = t["options"]
    if not o:
        return t["precision"]
    head = "_head8" if "matmul_mixed_precision" in o else "_floathead" if "nodes_to_exclude" in o else ""
    return f"{t['precision']}_b{o['block_size']}_acc{o['accuracy_level']}{head}"


def available() -> str | None:
    """Why the runtime cannot run here, or None."""
    try:
        import onnxruntime_genai  # noqa: F401
    except ImportError:
        return "onnxruntime-genai is not installed (pip install -e '.[ort]'; scripts/setup does)"
    return None


def unsupported(cfg) -> str | None:
    """Why this engine cannot run that job (a skip with its reason), or None."""
    return recipe.refusal(cfg, target) or available()


def runtime_name(cfg, device: str) -> str:
    import onnxruntime  # optional: the ort extra
    import onnxruntime_genai  # optional: the ort extra

    t, provider = target(recipe.of(cfg)), PROVIDERS.get(device, "cpu")
    o = t["options"]
    quant = "fp32"
    if o:
        acts = "int8" if o["accuracy_level"] == 4 else "fp32"
        quant = f"{t['precision']} MatMulNBits in blocks of {o['block_size']}, {acts} activations"
        quant += (
            ", the head int8"
            if "matmul_mixed_precision" in o
            else ", the head float"
            if "nodes_to_exclude" in o
            else ""
        )
    return (
        f"onnxruntime-genai {onnxruntime_genai.__version__} (onnxruntime {onnxruntime.__version__}), "
        f"{provider} provider, {quant} (the builder's)"
    )


def export(model, tokenizer, source_key: str, t: dict, provider: str, cache_dir: Path) -> Path:
    """The model as ONNX Runtime GenAI runs it: built once per (weights, target, provider), then cached."""
    import onnxruntime_genai  # optional: the ort extra

    key = f"{source_key}-{_label(t)}-{provider}"
    want = {
        "version": EXPORT_VERSION,
        "builder": onnxruntime_genai.__version__,
        "source": source_key,
        "precision": _label(t),
        "target": t,
        "provider": provider,
    }
    extra = [f"{k}={v}" for k, v in t["options"].items()]
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
            t["precision"],
            "-e",
            provider,
            "-c",
            str(work / "cache"),
            *(["--extra_options", *extra] if extra else []),
        ],
        f"ONNX Runtime GenAI ({_label(t)}, {provider} provider)",
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
        lambda: export(
            loaded.model, loaded.tokenizer, loaded.source_key, target(recipe.of(cfg)), provider, cfg.cache_dir
        ),
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
