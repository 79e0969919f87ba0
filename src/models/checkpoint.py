"""A model folder's weights read from its safetensors files as they are needed, not loaded whole.

A quantized job of a local checkpoint (`model.local_path=DIR`) builds its model with every parameter on the meta
device and reads from the files only those its job needs now (src.quant.apply.unmade): on a cache hit, all but the
linears its quantized weights replace; on a miss, all but the decoder layers (and an untied head), which the
quantization then reads one layer at a time (src.quant.stream). So a 7B checkpoint is never held whole in float32
(27 GB), nor read at all where its quantized weights are cached.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import torch
from accelerate import init_empty_weights
from safetensors import safe_open
from transformers import AutoConfig, AutoModelForCausalLM
from transformers.initialization import no_init_weights

INDEX = "model.safetensors.index.json"
HEAD_WEIGHT = "lm_head.weight"
SINGLE = "model.safetensors"


class MissingTensor(RuntimeError):
    """A parameter the model needs is in none of the folder's safetensors files."""


def tensor_files(folder: Path) -> dict[str, Path] | None:
    """Each tensor's file in a folder of safetensors weights (sharded, with its index, or one model.safetensors),
    or None where the folder has neither (weights in another form: the whole load reads them)."""
    if (folder / INDEX).is_file():
        index = json.loads((folder / INDEX).read_text())["weight_map"]
        return {key: folder / name for key, name in index.items()}
    if (folder / SINGLE).is_file():
        with safe_open(str(folder / SINGLE), framework="pt") as f:
            return {key: folder / SINGLE for key in f.keys()}
    return None


def _key(name: str, files: dict[str, Path]) -> str | None:
    """The checkpoint's key for a parameter: its own name, or without the `model.` prefix (older OPT files)."""
    for key in (name, name.removeprefix("model.")):
        if key in files:
            return key
    return None


def reader(model: torch.nn.Module, files: dict[str, Path], dtype: torch.dtype) -> Callable[[list[str]], None]:
    """Makes the named parameters (on the meta device) from the files, cast to `dtype`, each a copy of its own:
    safetensors hands out views of the file's mapping, and a layer's norms kept as views held its whole file mapped
    after its linears were dropped, every page read of it counted in the job's memory (a 7B's RTN build from a bf16
    checkpoint peaked at 15.1 GB, every layer's file, where a layer at a time takes ~3.5)."""

    def make(names: list[str]) -> None:
        by_file: dict[Path, list[tuple[str, str]]] = {}
        for name in names:
            key = _key(name, files)
            if key is None:
                raise MissingTensor(f"{name} is in none of its safetensors files; restore them from the model's source")
            by_file.setdefault(files[key], []).append((name, key))
        for path, pairs in by_file.items():
            with safe_open(str(path), framework="pt") as f:
                for name, key in pairs:
                    owner, _, leaf = name.rpartition(".")
                    module = model.get_submodule(owner)
                    param = module._parameters[leaf]
                    value = f.get_tensor(key).to(dtype, copy=True)
                    if tuple(value.shape) != tuple(param.shape):
                        raise MissingTensor(
                            f"{name} has shape {tuple(value.shape)} in {path.name}, where config.json builds "
                            f"{tuple(param.shape)}; restore config.json or the weights from the model's source"
                        )
                    module._parameters[leaf] = torch.nn.Parameter(value, requires_grad=False)

    return make


def hollow_model(folder: Path, hollow: Callable[[torch.nn.Module], set[str]], dtype: torch.dtype = torch.float32):
    """(model, make): the folder's model with the parameters `hollow(model)` names left on the meta device and
    every other one read from its files; `make` reads the rest when asked. None where the folder holds no
    safetensors weights."""
    files = tensor_files(folder)
    if files is None:
        return None
    config = AutoConfig.from_pretrained(str(folder), trust_remote_code=False)
    with no_init_weights(), init_empty_weights(include_buffers=False):  # buffers (rotary tables) are real
        model = AutoModelForCausalLM.from_config(config, dtype=dtype)
    make = reader(model, files, dtype)
    empty = hollow(model)
    tied = model.config.tie_word_embeddings  # the head is the embedding: tied below, not read
    make([name for name, _ in model.named_parameters() if name not in empty and not (tied and name == HEAD_WEIGHT)])
    if tied:
        model.tie_weights()
    return model.eval(), make
