"""A model at its published shape with random weights (`model.weights=random`): time a 7B model offline.

Decode time depends on the shapes (how many bytes each step reads, how many FLOPs each prefill does),
not on the weights' values, so the seeds' 7B models can be timed where no hub is reachable. Their
shapes ship as small JSON files in src/shapes/ (copied from each model's published config.json).
What random weights cannot give is any quality figure: src.assembly.config refuses those.

Built straight in bf16, with no initialisation pass: the parameters are allocated empty, then filled
by copying one random block (a memory copy, about as fast as the RAM), so a 7B model takes seconds.
The tokenizer is the byte-level one of the tiny models: its 259 ids are valid in every vocabulary.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import torch
from accelerate import init_empty_weights
from transformers import AutoConfig, AutoModelForCausalLM
from transformers.initialization import no_init_weights

from src.models.tiny import byte_tokenizer

SHAPES = Path(__file__).parents[1] / "shapes"
SEED = 0
STD = 0.02  # the published models' initializer_range
BLOCK = 1 << 22  # random values copied, shifted, into every weight


class NoShape(RuntimeError):
    """No published shape is shipped for this model; the message lists those that are."""


def shapes() -> list[str]:
    return sorted(p.stem for p in SHAPES.glob("*.json"))


def config_of(name: str):
    path = SHAPES / f"{name}.json"
    if not path.is_file():
        raise NoShape(
            f"model.weights=random needs {name}'s published shape and none is shipped; shapes: {', '.join(shapes())}"
        )
    spec = {k: v for k, v in json.loads(path.read_text()).items() if not k.startswith("_") and k != "architectures"}
    return AutoConfig.for_model(spec.pop("model_type"), **spec)


def parameter_count(config) -> int:
    """Exact, from a model built on the meta device (no memory)."""
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    return sum(p.numel() for p in model.parameters())


def fill(model: torch.nn.Module, seed: int = SEED, only: set[str] | None = None) -> None:
    """Norm scales 1, biases 0, every other weight N(0, STD): one random block copied with a different
    shift into each tensor, so no two layers are alike and nothing is drawn 7 billion times. The block is
    drawn on the CPU (the same numbers on every device) and copied to the parameters' device once. A parameter
    left on the meta device (never to be used: a cache holds what replaces it) is skipped, its shift counted, so
    every other one gets the values it gets in a model filled whole; so is one not in `only`, where given (filled
    before: a layer made later, src.quant.stream, leaves the others as they are)."""
    generator = torch.Generator().manual_seed(seed)
    device = next((p.device for p in model.parameters() if p.device.type != "meta"), torch.device("cpu"))
    block = (torch.randn(2 * BLOCK, generator=generator) * STD).to(device)
    shift = 0
    with torch.no_grad():
        for name, param in model.named_parameters():
            skip = param.device.type == "meta" or (only is not None and name not in only)
            if param.dim() == 1:
                if not skip:
                    param.fill_(1.0 if "norm" in name and name.endswith("weight") else 0.0)
                continue
            chunks = -(-param.numel() // BLOCK)
            if skip:
                shift = (shift + 7919 * chunks) % BLOCK
                continue
            source = block.to(param.dtype)
            flat = param.view(-1)
            for start in range(0, flat.numel(), BLOCK):
                n = min(BLOCK, flat.numel() - start)
                flat[start : start + n].copy_(source[shift : shift + n])
                shift = (shift + 7919) % BLOCK


def _allocate(model: torch.nn.Module, names, device) -> None:
    """Real, uninitialised storage on `device` for the named parameters (on the meta device until now)."""
    for full in names:
        owner, _, leaf = full.rpartition(".")
        module = model.get_submodule(owner)
        param = module._parameters[leaf]
        real = torch.empty(param.shape, dtype=param.dtype, device=device)
        module._parameters[leaf] = torch.nn.Parameter(real, requires_grad=param.requires_grad)


def maker(model: torch.nn.Module, seed: int = SEED, device: str = "cpu"):
    """Makes parameters a hollow build left unmade, by name, with the values a whole build gives them."""

    def make(names: list[str]) -> None:
        _allocate(model, names, device)
        fill(model, seed, only=set(names))

    return make


def random_model(
    name: str,
    dtype: torch.dtype = torch.bfloat16,
    seed: int = SEED,
    device: str = "cpu",
    hollow: Callable[[torch.nn.Module], set[str]] | None = None,
):
    """(model, tokenizer) for a shipped shape: parameters allocated uninitialised on `device`, then filled (a
    GPU job's 7B weights made there: no host copy to cast and move). `hollow(model)`, given the model with every
    parameter on the meta device, names the parameters that stay there, never allocated nor filled (a quantized
    cache replaces them: a cached 7B job holds its quantized weights, not 13 GB of bf16 it would drop)."""
    config = config_of(name)
    with no_init_weights(), init_empty_weights(include_buffers=False):  # buffers (rotary tables) are real
        model = AutoModelForCausalLM.from_config(config, dtype=dtype)
    empty = hollow(model) if hollow is not None else set()
    _allocate(model, [full for full, _ in model.named_parameters() if full not in empty], device)
    for module in model.modules():  # the buffers were made on the CPU: where the model runs
        for key, buffer in module._buffers.items():
            if buffer is not None and buffer.device != torch.device(device):
                module._buffers[key] = buffer.to(device)
    fill(model, seed)
    if model.config.tie_word_embeddings:
        model.tie_weights()
    return model.eval(), byte_tokenizer()
