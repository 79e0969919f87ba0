"""The quantized-model cache: safetensors + JSON, keyed by everything that changes the weights.

A key covers the model's source, the method and every parameter, and a hash of the calibration data. An entry is
a folder: quantized.json (each linear's format, the group size, what the build measured) and one safetensors file a
decoder layer (layer-00000.safetensors, ...) and one for the head, written as the layers are rounded
(src.quant.shards). Files are verified against their recorded sha256 on every load (src.common.cache): a damaged or
stale cache is rebuilt, never trusted.
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

from src.common.cache import build_cached
from src.quant import qparams
from src.quant.methods import QuantSpec
from src.quant.weights import QuantizedWeights

log = logging.getLogger(__name__)

# 15: AWQ's clip trials scored by bf16-operand GEMMs where the CPU multiplies bf16 natively (other clips where two
# trials' errors are within the operands' rounding);
# 14: GPTQ's errors sent on in runs of 512 features, a group's range by its block's inverse (other orders of sums);
# 13: the spec's fields and the entry's record under one name per idea (format, wide_linears: src.common.renames),
# the same weights; 12: the calibration windows through each layer in batches (src.quant.stream.per_call), its bf16 GEMMs on the
# host's float_gemm path (other orders of sums);
# 11: a local checkpoint's streamed layers calibrated in the precision's dtype (src.assembly.job), not float32;
# 10: GPTQ on the features held reversed (H's own Cholesky factor, no reversed copies), its updates in bf16 where
# the kernels have a bf16 dot product; AWQ's scale trials ranked
# by the outputs' change in one GEMM (bf16 where native); the Grams AWQ scales divided in place;
# 9: grouped weights stored in the gemv kernels' lane layout, read in place (qparams.pack_weights);
# 8: Grams of bf16 rows summed in another order, AWQ's scale trials ranked by bf16-operand GEMMs (src.quant.bf16math);
# 7: GPTQ rounds from one Cholesky factor of H, with no inverse (other float32 roundings); AWQ's clip search in
# smaller runs of rows (the same clips); 6: random weights made a layer at a time take the values a whole build gives them; 5: written layer by layer, a
# file each (src.quant.shards); 4: GPTQ rounds the decoder's linears in layer order; an older cache is rebuilt
FORMAT = 15
META = "quantized.json"


def cache_key(source_key: str, spec: QuantSpec, calibration_hash: str) -> str:
    blob = json.dumps(
        {"format": FORMAT, "source": source_key, "spec": dataclasses.asdict(spec), "calibration": calibration_hash},
        sort_keys=True,
    )
    return hashlib.sha256(blob.encode()).hexdigest()


class StoredLayers(Mapping):
    """A cached model's quantized linears, each read from the safetensors file (memory-mapped) when it is asked
    for and not kept here. Grouped weights in the gemv kernels' lane layout (qparams.pack_weights) come as views
    of the mapped file, which those kernels read in place: the page cache holds a cached model's weights once,
    shared by every job that maps them, and nothing is copied at load. The rest come as copies."""

    def __init__(self, files: dict[str, Path], fields: dict[str, list[str]], sizes: dict[str, int]):
        self.files, self.fields, self.sizes = files, fields, sizes

    def __getitem__(self, name: str) -> dict[str, torch.Tensor]:
        # The small tensors copied: a module that kept a view of one (a scale already float32) keeps the whole
        # file mapped, and every page of it read at load (a linear that unpacks its lanes to a layout of its own,
        # ATen's int4 one) would stay resident beside that module's own copy (a 7B's 4 GB twice).
        tensors = {}
        with safe_open(str(self.files[name]), framework="pt") as f:
            for field in self.fields[name]:
                tensor = f.get_tensor(f"layer/{name}/{field}")
                tensors[field] = tensor if field.startswith(qparams.LANES) else tensor.clone()
        return tensors

    def __iter__(self) -> Iterator[str]:
        return iter(self.fields)

    def __len__(self) -> int:
        return len(self.fields)


def weight_files(directory: Path) -> list[Path]:
    """A cache entry's safetensors files, in layer order (the head's last)."""
    return sorted(directory.glob("*.safetensors"))


def stored_bytes(directory: Path) -> int | None:
    """The bytes of a whole cache entry's weight files, or None where it holds none."""
    files = weight_files(directory) if (directory / META).is_file() else []
    return sum(f.stat().st_size for f in files) if files else None


def load(directory: Path) -> QuantizedWeights:
    meta = json.loads((directory / META).read_text())
    if meta.get("format") != FORMAT:
        raise ValueError(f"quantized cache format {meta.get('format')} != {FORMAT}")
    files: dict[str, Path] = {}
    fields: dict[str, list[str]] = {}
    sizes: dict[str, int] = {}
    floats = {}
    for path in weight_files(directory):
        with safe_open(str(path), framework="pt") as f:
            for key in f.keys():
                kind, rest = key.split("/", 1)
                if kind == "float":
                    floats[rest] = f.get_tensor(key).clone()
                    continue
                name, field = rest.rsplit("/", 1)
                files[name] = path
                fields.setdefault(name, []).append(field)
                part = f.get_slice(key)
                sizes[name] = sizes.get(name, 0) + math.prod(part.get_shape()) * _BYTES[part.get_dtype()]
    if set(meta["formats"]) != set(fields):
        raise ValueError("quantized cache lists other layers than it holds")
    layers = StoredLayers(files, fields, sizes)
    return QuantizedWeights(meta["formats"], meta["group_size"], layers, floats, meta.get("info", {}))


# a safetensors dtype's bytes an element
_BYTES = {"F32": 4, "F16": 2, "BF16": 2, "I8": 1, "U8": 1, "I16": 2, "I32": 4, "I64": 8, "F64": 8, "BOOL": 1}


def load_or_build(
    directory: Path, build: Callable[[Path], None], meta: dict, before_load: Callable[[], None] | None = None
) -> tuple[QuantizedWeights, bool]:
    """(weights, built_now): the entry in `directory`, built by `build(out)` where it is missing or damaged, in a
    folder that a killed build leaves for the next to resume (src.quant.shards). `before_load` runs just before a
    cache built earlier is read (the caller frees the float weights it replaces, so a 7B model is never held
    twice). A cache that verifies but will not parse is removed, and the job says so in one line."""
    built = []

    def make(out: Path) -> None:
        build(out)
        built.append(True)

    build_cached(directory, make, meta, "quantized model", resumable=True)
    if not built and before_load is not None:
        before_load()
    try:
        return load(directory), bool(built)
    except (ValueError, KeyError, TypeError, AttributeError, OSError, json.JSONDecodeError) as err:
        shutil.rmtree(directory)
        raise RuntimeError(
            f"quantized cache {directory} is unreadable ({err}); removed: rerun the job to rebuild it"
        ) from err
