"""A job's quantization step: calibration data -> cache key -> load or build -> install.

Takes a float32 model and returns it quantized for its precision, with a report of what it cost.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

from src.common.paths import child
from src.models.config import ModelConfig
from src.quant import cache
from src.quant.calibrate import calibration_ids, ids_hash
from src.quant.config import PrecisionConfig
from src.quant.methods import QuantSpec
from src.quant.pipeline import install, quantize, quantized_bytes, release_quantized


@dataclass
class QuantReport:
    cache_dir: Path
    built: bool  # False: loaded from the cache
    seconds: float  # building (calibration, search, rounding) or loading
    quantized_bytes: int
    alpha: float | None = None  # SmoothQuant's, where it applied

    def metrics(self) -> dict[str, float]:
        return {
            ("quantize_s" if self.built else "quant_load_s"): self.seconds,
            "quantized_weights_mb": self.quantized_bytes / 2**20,
        }


def quantize_model(
    model: nn.Module,
    tokenizer,
    arch: str,
    spec: QuantSpec,
    source_key: str,
    corpus: Callable[[], str],
    calib_samples: int,
    calib_seq_len: int,
    cache_root: Path,
    label: str,
    dtype: torch.dtype,
    gemv: bool = False,
    device: str = "cpu",
) -> tuple[nn.Module, QuantReport]:
    start = time.perf_counter()
    # A method that reads no data (RTN) hashes none: its key stays independent of the dataset.
    calib = None if not spec.calibrates else calibration_ids(tokenizer, corpus(), calib_samples, calib_seq_len)
    key = cache.cache_key(source_key, spec, "none" if calib is None else ids_hash(calib))
    directory = child(cache_root / "quantized", f"{label}-{spec.scheme}-{spec.method}-{key[:16]}")
    weights, built = cache.load_or_build(
        directory,
        lambda: quantize(model, arch, spec, calib),
        {"source": source_key, "key": key},
        before_load=lambda: release_quantized(model, arch, spec),
    )
    model = install(model.to(dtype), weights, dtype, gemv, device)
    return model, QuantReport(
        directory, built, time.perf_counter() - start, quantized_bytes(weights), getattr(spec, "alpha", None)
    )


def prepare(
    loaded,
    model_cfg: ModelConfig,
    precision: PrecisionConfig,
    corpus: Callable[[], str],
    cache_root: Path,
    gemv: bool = False,
    device: str = "cpu",
) -> tuple[nn.Module, QuantReport | None]:
    """A loaded float32 model, cast to the precision's dtype and quantized first where it asks (its
    quantized linears with quantspec's few-row kernels where `gemv`, built on `device`: the job's)."""
    dtype = getattr(torch, precision.dtype)
    if not precision.quantized:
        return loaded.model.to(dtype), None
    return quantize_model(
        loaded.model,
        loaded.tokenizer,
        model_cfg.arch,
        precision.spec(model_cfg),
        loaded.source_key,
        corpus,
        precision.calib_samples,
        precision.calib_seq_len,
        cache_root,
        model_cfg.name,
        dtype,
        gemv,
        device,
    )
