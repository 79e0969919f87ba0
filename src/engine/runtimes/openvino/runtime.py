"""`engine=openvino` (named apart from the `openvino` package it imports): OpenVINO, Intel's runtime, with the model exported and compressed by optimum-intel
(optimum's OpenVINO integration) and NNCF.

optimum-intel 2.2 accepts transformers >= 4.51, < 5.6 and its exporter refuses what this project runs
(transformers 5.23), so the export runs in a virtual environment of its own (`.venv-ov`, made by
scripts/setup: torch, transformers 5.0, optimum-intel, NNCF) on the job's model written once as a
Hugging Face folder; only OpenVINO itself runs in the job. Each precision is mapped to NNCF's weight
compression (`src/engine/runtimes/openvino/export.py`): w8a16 is int8 weights (asymmetric, per channel), w4a16
int4 (asymmetric, groups of 128) with NNCF's AWQ on quantspec's calibration texts, fp32 none; w8a8 is
NNCF's full quantization, SmoothQuant at quantspec's alpha then int8 weights and static int8 activations,
calibrated on the same texts (fp32 and w8a8 run their float parts in fp32, as quantspec's do). The export
is cached under `<cache_dir>/openvino/<model>-<precision>/` with a JSON manifest.

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
from src.engine.runtimes.exports import cached_export, exported
from src.engine.runtimes.isolated import Maker, no_crash_hint
from src.quality.scoring import score_logits

log = logging.getLogger("quantspec")
# the package's names: the Runtime's members (src.engine.config.Runtime), and what tests and scripts use
__all__ = [*RUNTIME_NAMES, "PRECISIONS", "OpenVINO", "available", "export"]

TITLE = "OpenVINO"
crash_hint = no_crash_hint  # nothing known to do about a crash of its native code on a particular host


PRECISIONS = {"fp32": "fp32", "w8a16": "int8", "w4a16": "int4_awq", "w8a8": "int8_sq"}
CALIBRATED = ("int4_awq", "int8_sq")  # the NNCF methods that read calibration texts
EXPORT_VERSION = 1
ROOT = PROJECT_ROOT


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
    precision = cfg.precision.name
    if precision not in PRECISIONS:
        why = {"bf16": "OpenVINO keeps fp32 weights and picks bf16 for activations itself"}.get(
            precision, "no NNCF mapping for it"
        )
        return f"engine openvino has no {precision} ({why}); it runs {', '.join(PRECISIONS)}"
    return available()


def runtime_name(cfg, device: str) -> str:
    import openvino  # optional: the ov extra

    precision = cfg.precision.name
    method = {
        "fp32": "fp32",
        "int8": "NNCF int8 weights (asym, per channel)",
        "int4_awq": "NNCF int4 weights (asym, group 128) with AWQ",
        "int8_sq": f"NNCF SmoothQuant (alpha {_alpha(cfg)}), int8 weights and static int8 activations",
    }[PRECISIONS[precision]]
    rest = {"fp32": "fp32 activations", "w8a8": "its float parts in fp32"}.get(
        precision, "the CPU's default activations (bf16 where it has it)"
    )
    return f"openvino {openvino.__version__.split('-')[0]} CPU, exported by optimum-intel, {method}, {rest}"


def _f32(precision: str) -> bool:
    """fp32 activations where quantspec's own run of that precision has them (its float parts in fp32)."""
    return precision in ("fp32", "w8a8")


def _alpha(cfg) -> float:
    """SmoothQuant's migration strength as quantspec's own run of the precision takes it (read by NNCF only
    for int8_sq, whose quantspec precision is SmoothQuant's; 0.5, NNCF's default, elsewhere)."""
    spec = cfg.precision.spec(cfg.model) if cfg.precision.quantized else None
    return getattr(spec, "alpha", None) or 0.5


def export(
    model, tokenizer, source_key: str, precision: str, calibration: list[str], cache_dir: Path, alpha: float = 0.5
) -> Path:
    """The model as OpenVINO runs it: exported once per (weights, precision, calibration, alpha), then cached."""
    key = f"{source_key}-{PRECISIONS[precision]}"
    want = {
        "version": EXPORT_VERSION,
        "source": source_key,
        "precision": PRECISIONS[precision],
        "calibration": len(calibration),
        **({"alpha": alpha} if PRECISIONS[precision] == "int8_sq" else {}),
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
            PRECISIONS[precision],
            str(work / "calibration.json"),
            str(alpha),
        ],
        f"OpenVINO ({PRECISIONS[precision]})",
        files={"calibration.json": json.dumps(calibration)},
        env={**os.environ, "HF_HUB_OFFLINE": "1"},
    )


def build(cfg, loaded, placement, corpus, recorder):
    """The job's weights exported and compressed at the precision (cached; w4a16's AWQ and w8a8's
    SmoothQuant calibrated on the job's calibration texts); returned as what compiles it for the CPU (in the
    runtime's own process)."""
    texts = []
    if PRECISIONS[cfg.precision.name] in CALIBRATED:  # 16 pieces of the corpus quantspec calibrates on
        text = corpus.reader("calibration")()
        texts = [piece for piece in (text[i * 2000 : (i + 1) * 2000] for i in range(16)) if piece.strip()]
    folder = exported(
        recorder,
        lambda: export(
            loaded.model, loaded.tokenizer, loaded.source_key, cfg.precision.name, texts, cfg.cache_dir, _alpha(cfg)
        ),
        "openvino",
        "openvino/CPU",
    )
    return Maker(
        "src.engine.runtimes.openvino.runtime:OpenVINO",
        folder,
        tuple(sorted(eos_ids(loaded.model))),
        f32=_f32(cfg.precision.name),
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
