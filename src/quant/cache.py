"""The quantized-model cache: safetensors + JSON, keyed by everything that changes the weights.

A key covers the model's source, the method and every parameter, and a hash of the calibration data.
Files are verified against their recorded sha256 on every load (src.common.cache): a damaged
or stale cache is rebuilt, never trusted.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import shutil
from collections.abc import Callable
from pathlib import Path

from safetensors.torch import load_file, save_file

from src.common.cache import build_cached
from src.quant.methods import QuantSpec
from src.quant.pipeline import QuantizedWeights

log = logging.getLogger(__name__)

# 4: GPTQ rounds the decoder's linears in layer order (3: "kernels" renamed "schemes"); an older cache is rebuilt
FORMAT = 4
WEIGHTS, META = "quantized.safetensors", "quantized.json"


def cache_key(source_key: str, spec: QuantSpec, calibration_hash: str) -> str:
    blob = json.dumps(
        {"format": FORMAT, "source": source_key, "spec": dataclasses.asdict(spec), "calibration": calibration_hash},
        sort_keys=True,
    )
    return hashlib.sha256(blob.encode()).hexdigest()


def save(directory: Path, weights: QuantizedWeights) -> None:
    tensors = {f"layer/{name}/{k}": t.contiguous() for name, ts in weights.layers.items() for k, t in ts.items()}
    tensors.update({f"float/{name}": t.contiguous() for name, t in weights.floats.items()})
    save_file(tensors, str(directory / WEIGHTS))
    (directory / META).write_text(
        json.dumps(
            {"format": FORMAT, "schemes": weights.schemes, "group_size": weights.group_size, "info": weights.info},
            indent=2,
        )
    )


def load(directory: Path) -> QuantizedWeights:
    meta = json.loads((directory / META).read_text())
    if meta.get("format") != FORMAT:
        raise ValueError(f"quantized cache format {meta.get('format')} != {FORMAT}")
    layers: dict[str, dict] = {}
    floats = {}
    for key, tensor in load_file(str(directory / WEIGHTS)).items():
        kind, rest = key.split("/", 1)
        if kind == "float":
            floats[rest] = tensor
        else:
            name, field = rest.rsplit("/", 1)
            layers.setdefault(name, {})[field] = tensor
    if set(meta["schemes"]) != set(layers):
        raise ValueError("quantized cache lists other layers than it holds")
    return QuantizedWeights(meta["schemes"], meta["group_size"], layers, floats, meta.get("info", {}))


def load_or_build(
    directory: Path, build: Callable[[], QuantizedWeights], meta: dict, before_load: Callable[[], None] | None = None
) -> tuple[QuantizedWeights, bool]:
    """(weights, built_now). `before_load` runs just before a whole cache is read (the caller frees the
    float weights it replaces, so a 7B model is never held twice). A cache that verifies but will not
    parse is rebuilt once, where the float weights are still there to rebuild it from."""
    built = []

    def make(out: Path) -> None:
        weights = build()
        save(out, weights)
        built.append(weights)

    build_cached(directory, make, meta, "quantized model")
    if built:
        return built[0], True
    if before_load is not None:
        before_load()
    try:
        return load(directory), False
    except (ValueError, KeyError, TypeError, AttributeError, OSError, json.JSONDecodeError) as err:
        shutil.rmtree(directory)
        if before_load is not None:
            raise RuntimeError(
                f"quantized cache {directory} is unreadable ({err}); removed: rerun the job to rebuild it"
            ) from err
        log.warning("quantized cache %s is unreadable (%s); rebuilding it", directory, err)
        build_cached(directory, make, meta, "quantized model")
        return built[0], True
