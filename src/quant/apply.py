"""A job's quantization step: calibration data -> cache key -> load or build -> install.

Takes a float model (float32; a streamed build's in the precision's dtype: bf16 random weights, a local folder's
layers) and returns it quantized for its precision, with a report of what it cost; the calibration runs in the
dtype the model has.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

from src.common.cache import damage
from src.common.paths import child
from src.models.config import ModelConfig
from src.models.families import HEAD
from src.quant import cache, stream
from src.quant.arch import decoder_layers, layer_prefix
from src.quant.calibrate import calibration_ids, ids_hash
from src.quant.config import PrecisionConfig
from src.quant.methods import QuantSpec
from src.quant.pipeline import install, quantized_bytes, quantized_linears, release_quantized
from src.quant.shards import Partial
from src.quant.stream import Maker, replaced_params


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


@dataclass(frozen=True)
class Entry:
    """Where a job's quantized weights are cached, what its manifest wants, and the calibration they come from."""

    directory: Path
    meta: dict
    calib: torch.Tensor | None


def entry(
    tokenizer, spec: QuantSpec, source_key: str, corpus: Callable[[], str], calib_samples: int, calib_seq_len: int,
    cache_root: Path, label: str,
) -> Entry:  # fmt: skip
    """The cache entry of these weights, quantized by `spec` from this calibration (a method that reads no data,
    RTN, hashes none: its key stays independent of the dataset)."""
    calib = None if not spec.calibrates else calibration_ids(tokenizer, corpus(), calib_samples, calib_seq_len)
    key = cache.cache_key(source_key, spec, "none" if calib is None else ids_hash(calib))
    directory = child(cache_root / "quantized", f"{label}-{spec.format}-{spec.method}-{key[:16]}")
    return Entry(directory, {"source": source_key, "key": key}, calib)


def replaced(model: nn.Module, arch: str, spec: QuantSpec) -> set[str]:
    """The float parameters a spec's quantized weights replace (a head tied to the embedding shares its parameter,
    which stays)."""
    return replaced_params(quantized_linears(model, arch, spec))


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
    make: Maker | None = None,
    float_gemm: str = "bf16",
) -> tuple[nn.Module, QuantReport]:
    """The model quantized for `spec`, from its cache entry, built layer by layer where it is missing (a killed
    build resumed: src.quant.shards). `make` makes the float weights a hollow model was built without;
    `float_gemm` is how the calibration forwards multiply bf16 (src.quant.stream.quantize)."""
    start = time.perf_counter()
    where = entry(tokenizer, spec, source_key, corpus, calib_samples, calib_seq_len, cache_root, label)
    directory = where.directory

    def build(out: Path) -> None:
        stream.quantize(model, arch, spec, where.calib, make, Partial(out, where.meta), float_gemm)

    weights, built = cache.load_or_build(
        directory, build, where.meta, before_load=lambda: release_quantized(model, arch, spec)
    )
    model = install(model.to(dtype), weights, dtype, gemv, device)
    return model, QuantReport(
        directory, built, time.perf_counter() - start, quantized_bytes(weights), getattr(spec, "alpha", None)
    )


def unmade(
    model_cfg: ModelConfig, precision: PrecisionConfig, corpus: Callable[[], str], cache_root: Path
) -> Callable[[nn.Module, object, str], set[str]]:
    """For a model built with its parameters on the meta device (and its tokenizer and source key): the ones to
    leave there. Where the cache holds this job's quantized weights whole: every float parameter they replace, never
    made. Where it does not: every decoder layer's, and the head's where it is quantized and its own (not the
    embedding's), made a layer at a time as the quantization reaches them (src.quant.stream), so the float model
    is never held whole."""

    def hollow(model: nn.Module, tokenizer, source_key: str) -> set[str]:
        spec = precision.spec(model_cfg)
        where = entry(
            tokenizer, spec, source_key, corpus, precision.calib_samples, precision.calib_seq_len,
            cache_root, model_cfg.name,
        )  # fmt: skip
        # its manifest, sizes and settings: the load (build_cached) hashes the files, once
        if where.directory.is_dir() and damage(where.directory, where.meta, hashed=False) is None:
            return replaced(model, model_cfg.arch, spec)
        arch = model_cfg.arch
        names = {
            layer_prefix(arch, i) + n
            for i, layer in enumerate(decoder_layers(model, arch))
            for n, _ in layer.named_parameters()
        }
        if spec.quantize_head and not model.config.tie_word_embeddings:
            names |= {f"{HEAD}.{n}" for n, _ in model.get_submodule(HEAD).named_parameters()}
        return names

    return hollow


def prepare(
    loaded,
    model_cfg: ModelConfig,
    precision: PrecisionConfig,
    corpus: Callable[[], str],
    cache_root: Path,
    gemv: bool = False,
    device: str = "cpu",
    float_gemm: str = "bf16",
) -> tuple[nn.Module, QuantReport | None]:
    """A loaded float model, cast to the precision's dtype and quantized first where it asks (its
    quantized linears with quantspec's few-row kernels where `gemv`, built on `device`: the job's; its
    calibration forwards' bf16 GEMMs on the `float_gemm` path, src.kernels.modules.FLOAT_GEMMS)."""
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
        loaded.make,
        float_gemm,
    )
