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
import math
import shutil
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import save_file

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


class StoredLayers(Mapping):
    """A cached model's quantized linears, each read from the safetensors file (memory-mapped) when it is asked
    for and not kept here: installing a model holds its runtime modules and one linear's portable tensors at a
    time, never the whole file's copy beside them (a 7B's 4 GB twice)."""

    def __init__(self, path: Path, fields: dict[str, list[str]], sizes: dict[str, int]):
        self.path, self.fields, self.sizes = path, fields, sizes

    def __getitem__(self, name: str) -> dict[str, torch.Tensor]:
        # copies, not views of the mapping: a module that kept one (a scale already float32) had kept the whole
        # file mapped, every page read staying resident (a 7B's 4 GB beside its runtime modules)
        with safe_open(str(self.path), framework="pt") as f:
            return {field: f.get_tensor(f"layer/{name}/{field}").clone() for field in self.fields[name]}

    def __iter__(self) -> Iterator[str]:
        return iter(self.fields)

    def __len__(self) -> int:
        return len(self.fields)


def load(directory: Path) -> QuantizedWeights:
    meta = json.loads((directory / META).read_text())
    if meta.get("format") != FORMAT:
        raise ValueError(f"quantized cache format {meta.get('format')} != {FORMAT}")
    fields: dict[str, list[str]] = {}
    sizes: dict[str, int] = {}
    floats = {}
    with safe_open(str(directory / WEIGHTS), framework="pt") as f:
        for key in f.keys():
            kind, rest = key.split("/", 1)
            if kind == "float":
                floats[rest] = f.get_tensor(key).clone()
                continue
            name, field = rest.rsplit("/", 1)
            fields.setdefault(name, []).append(field)
            part = f.get_slice(key)
            sizes[name] = sizes.get(name, 0) + math.prod(part.get_shape()) * _BYTES[part.get_dtype()]
    if set(meta["schemes"]) != set(fields):
        raise ValueError("quantized cache lists other layers than it holds")
    layers = StoredLayers(directory / WEIGHTS, fields, sizes)
    return QuantizedWeights(meta["schemes"], meta["group_size"], layers, floats, meta.get("info", {}))


# a safetensors dtype's bytes an element
_BYTES = {"F32": 4, "F16": 2, "BF16": 2, "I8": 1, "U8": 1, "I16": 2, "I32": 4, "I64": 8, "F64": 8, "BOOL": 1}


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
