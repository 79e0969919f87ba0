"""`engine=openvino` (named apart from the `openvino` package it imports): OpenVINO, Intel's runtime, with the model exported and compressed by optimum-intel
(optimum's OpenVINO integration) and NNCF.

optimum-intel 2.2 accepts transformers >= 4.51, < 5.6 and its exporter refuses what this project runs
(transformers 5.23), so the export runs in a virtual environment of its own (`.venv-ov`, made by
scripts/setup: torch, transformers 5.0, optimum-intel, NNCF) on the job's model written once as a
Hugging Face folder; only OpenVINO itself runs in the job. What the precision is (src.engine.runtimes.recipe: its
formats, group size, method, head; never its name) is mapped to NNCF's compression (`target`, run by
`src/engine/runtimes/openvino/export.py`): int8 weight-only linears to int8 weights (asymmetric, per channel);
4-bit weight-only ones to int4 (asymmetric, in the precision's groups), with NNCF's AWQ on quantspec's calibration
texts where the method is AWQ, the head at int8 (NNCF's backup precision) or 4 bits as the precision's is; w8a8's
int8 weights and activations to NNCF's full quantization, SmoothQuant at quantspec's alpha then static int8
activations on the same texts; fp32 to none. What NNCF cannot express (5- and 6-bit weights, named linears kept
wider, GPTQ, int8 activations beside 4-bit weights) is refused in one line naming the field. fp32 and w8a8 run their
float parts in fp32, as quantspec's do. The export is cached under `<cache_dir>/openvino/<model>-<target>/` with a
JSON manifest.

Generation is a loop of quantspec's own over OpenVINO's stateful model (prefill, then one token per
inference, the KV cache held as the model's state), so each token is timestamped when it exists and
greedy decoding is the same argmax every engine takes; perplexity scores a window from its logits for
every position.
"""

from __future__ import annotations

import json
import logging
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from src.common.environment import PROJECT_ROOT
from src.engine.config import RUNTIME_NAMES
from src.engine.generation import Generation, Request, eos_ids, token_loop
from src.engine.runtimes import recipe
from src.engine.runtimes.exports import cached_export, exported
from src.engine.runtimes.isolated import Maker, no_crash_hint
from src.engine.runtimes.recipe import Inexpressible, Recipe
from src.quality.scoring import score_logits

log = logging.getLogger("quantspec")
# the package's names: the Runtime's members (src.engine.config.Runtime), and what tests and scripts use
__all__ = [*RUNTIME_NAMES, "OpenVINO", "available", "export", "target"]

TITLE = "OpenVINO"
crash_hint = no_crash_hint  # nothing known to do about a crash of its native code on a particular host


EXPORT_VERSION = 2  # 2: the target read from what the precision is (its group size too), not its name
ROOT = PROJECT_ROOT


def target(r: Recipe) -> dict:
    """NNCF's compression for a precision (export.py's options: mode fp32, int8, int4 or int8_sq, and int4's group
    size, AWQ and whether the head is 4-bit too), or Inexpressible saying, in one line, which field OpenVINO cannot
    express."""
    if r.layers is None:
        if r.dtype != "float32":
            raise Inexpressible(
                f"engine openvino has no precision.dtype={r.dtype} (OpenVINO keeps fp32 weights and picks bf16 for "
                f"activations itself); use precision=fp32"
            )
        return {"mode": "fp32"}
    recipe.refuse_gptq_and_bits(r, "openvino", "export rounds to nearest (after AWQ where asked)")
    if r.layers.bits == 8:
        if r.layers.act_bits == 8:  # NNCF's full quantization is SmoothQuant's
            if r.method != "smoothquant":
                raise Inexpressible(
                    f"engine openvino's int8 activations come with SmoothQuant's scales: precision.method={r.method}; "
                    f"use precision.method=smoothquant"
                )
            return {"mode": "int8_sq", "alpha": r.alpha}
        if r.method != "rtn":  # NNCF's int8 weight compression reads no data
            raise Inexpressible(
                f"engine openvino's int8 weights are rounded to nearest, with no {r.method} scales: "
                f"precision.method={r.method}; use precision.method=rtn"
            )
        return {"mode": "int8"}
    if r.layers.act_bits != 16:
        raise Inexpressible(
            f"engine openvino has no int8 activations beside 4-bit weights: {r.layers.field}={r.layers.name}"
        )
    if r.wide_linears:
        raise Inexpressible(
            f"engine openvino's int4 export keeps no named linears wider (NNCF picks its own by ratio): "
            f"precision.wide_linears={list(r.wide_linears)}; set precision.wide_linears=[]"
        )
    if r.head is None:
        raise Inexpressible("engine openvino's int4 export quantizes the head: precision.quantize_head=false")
    if r.head.bits == 8 and r.head.act_bits != 16:
        raise Inexpressible(f"engine openvino's int8 head is weight-only: {r.head.field}={r.head.name}")
    if r.method not in ("awq", "rtn"):
        raise Inexpressible(f"engine openvino's int4 export has AWQ or none: precision.method={r.method}")
    if r.head.bits == 4 and r.head.group != r.layers.group:
        raise Inexpressible(f"engine openvino's 4-bit head takes the layers' groups: {r.head.field}={r.head.name}")
    return {"mode": "int4", "group_size": r.layers.group, "awq": r.method == "awq", "all_layers": r.head.bits == 4}


def _label(t: dict) -> str:
    """The target in a few characters: the export's cache folder and manifest name it."""
    if t["mode"] == "int4":
        return f"int4_g{t['group_size']}{'_awq' if t['awq'] else ''}_head{4 if t['all_layers'] else 8}"
    return f"int8_sq_a{t['alpha']:g}" if t["mode"] == "int8_sq" else t["mode"]


def export_python() -> Path:
    """The interpreter of the export's own environment (QUANTSPEC_OV_PYTHON, else .venv-ov)."""
    return Path(os.environ.get("QUANTSPEC_OV_PYTHON") or ROOT / ".venv-ov" / "bin" / "python")


def available() -> str | None:
    """Why this engine cannot run here, or None."""
    try:
        import openvino  # noqa: F401
    except ImportError:
        return "openvino is not installed (pip install -e '.[ov]'; scripts/setup does)"
    if not export_python().is_file():
        return (
            f"no optimum-intel environment for the export at {export_python()} (scripts/setup makes .venv-ov, "
            f"or set QUANTSPEC_OV_PYTHON)"
        )
    return None


def unsupported(cfg) -> str | None:
    """Why this engine cannot run that job (a skip with its reason), or None."""
    return recipe.refusal(cfg, target) or available()


def runtime_name(cfg, device: str) -> str:
    import openvino  # optional: the ov extra

    r = recipe.of(cfg)
    t = target(r)
    if t["mode"] == "int4":
        head = "its head too" if t["all_layers"] else "its head and embedding int8"
        awq = " with AWQ" if t["awq"] else ""
        method = f"NNCF int4 weights (asym, group {t['group_size']}){awq}, {head}"
    else:
        method = {
            "fp32": "fp32",
            "int8": "NNCF int8 weights (asym, per channel)",
            "int8_sq": f"NNCF SmoothQuant (alpha {t.get('alpha')}), int8 weights and static int8 activations",
        }[t["mode"]]
    if not _f32(r):
        rest = "the CPU's default activations (bf16 where it has it)"
    else:
        rest = "its float parts in fp32" if r.layers is not None else "fp32 activations"
    return f"openvino {openvino.__version__.split('-')[0]} CPU, exported by optimum-intel, {method}, {rest}"


def _f32(r: Recipe) -> bool:
    """fp32 activations where quantspec's own run of the precision has them (its float parts in fp32)."""
    return r.dtype == "float32"


def export(model, tokenizer, source_key: str, t: dict, calibration: list[str], cache_dir: Path) -> Path:
    """The model as OpenVINO runs it: exported once per (weights, target, calibration), then cached."""
    key = f"{source_key}-{_label(t)}"
    want = {
        "version": EXPORT_VERSION,
        "source": source_key,
        "precision": _label(t),
        "target": t,
        "calibration": len(calibration),
    }
    return cached_export(
        Path(cache_dir) / "openvino" / key,
        want,
        model,
        tokenizer,
        lambda work: [
            str(export_python()),
            str(ROOT / "src" / "engine" / "runtimes" / "openvino" / "export.py"),
            str(work / "hf"),
            str(work / "model"),
            json.dumps(t),
            str(work / "calibration.json"),
        ],
        f"OpenVINO ({_label(t)})",
        files={"calibration.json": json.dumps(calibration)},
        env={**os.environ, "HF_HUB_OFFLINE": "1"},
    )


def build(cfg, loaded, placement, corpus, recorder):
    """The job's weights exported and compressed as its precision is (cached; AWQ and SmoothQuant calibrated on
    the job's calibration texts); returned as what compiles it for the CPU (in the runtime's own process)."""
    r = recipe.of(cfg)
    t = target(r)
    texts = []
    if t.get("awq") or t["mode"] == "int8_sq":  # 16 pieces of the corpus quantspec calibrates on
        text = corpus.reader("calibration")()
        texts = [piece for piece in (text[i * 2000 : (i + 1) * 2000] for i in range(16)) if piece.strip()]
    folder = exported(
        recorder,
        lambda: export(loaded.model, loaded.tokenizer, loaded.source_key, t, texts, cfg.cache_dir),
        "openvino",
        "openvino/CPU",
    )
    return Maker(
        "src.engine.runtimes.openvino.runtime:OpenVINO",
        folder,
        tuple(sorted(eos_ids(loaded.model))),
        f32=_f32(r),
    )


@dataclass
class OpenVINO:
    """The engine: called as every engine is (the torch model is ignored: OpenVINO holds its own)."""

    folder: Path
    eos: tuple[int, ...] = ()
    f32: bool = True  # fp32 activations (OpenVINO runs bf16 on CPUs that have it unless told)

    def __post_init__(self):
        import openvino as ov  # optional: the ov extra

        config = {"INFERENCE_PRECISION_HINT": "f32"} if self.f32 else {}
        self.compiled = ov.Core().compile_model(str(self.folder / "openvino_model.xml"), "CPU", config)
        self.request = self.compiled.create_infer_request()

    def _infer(self, ids: list[int], past: int) -> np.ndarray:
        """Logits of `ids` appended to the `past` positions the request's state holds."""
        n = len(ids)
        self.request.infer(
            {
                "input_ids": np.array([ids], dtype=np.int64),
                "attention_mask": np.ones((1, past + n), dtype=np.int64),
                "position_ids": np.arange(past, past + n, dtype=np.int64)[None],
                "beam_idx": np.zeros(1, dtype=np.int32),
            }
        )
        return self.request.get_tensor("logits").data[0]

    def window_score(self, ids, indices=None):
        """The window scored from OpenVINO's logits for every position (src.quality.scoring)."""

        self.request.reset_state()
        return score_logits(torch.from_numpy(self._infer(ids.tolist(), 0).astype(np.float32)), ids, indices)

    def __call__(self, model, request: Request) -> Generation:
        input_ids, max_new_tokens, exact, sampling, pad_token_id, stop = request
        self.request.reset_state()
        held = [0]  # positions the request's state holds

        def next_logits(ids: list[int]) -> np.ndarray:
            logits = self._infer(ids, held[0])[-1]
            held[0] += len(ids)
            return logits

        return token_loop(next_logits, input_ids[0].tolist(), max_new_tokens, exact, self.eos, sampling, stop)
