"""Typed configuration: the composed Hydra config becomes these dataclasses once, at the entry point.

Everything downstream takes these objects, never a DictConfig. Validation names the field, the allowed
values and the value received, so a bad sweep fails with one line a user can act on.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

ARCHS = ("llama", "opt", "qwen2", "gemma3")
MODEL_SOURCES = ("gguf_package", "hub", "local", "tiny")
DEVICES = ("cpu", "cuda", "npu")
DTYPES = ("float32", "bfloat16", "float16")
QUANT_METHODS = ("none",)
DRAFT_KINDS = ("none",)
TASK_KINDS = ("decode", "benchmark")
DATASET_SOURCES = ("humaneval", "hf", "textfile")
TRACKING_KINDS = ("sqlite", "server")


class ConfigError(ValueError):
    """A setting a user can fix: the message is the one line they see."""


def _check_choice(where: str, value: Any, allowed: tuple[str, ...]) -> None:
    if value not in allowed:
        raise ConfigError(f"{where}={value!r} is not one of: {', '.join(allowed)}")


@dataclass(frozen=True)
class ModelConfig:
    name: str
    arch: str
    source: str
    id: str
    local_path: str | None = None
    code: bool = False

    def validate(self) -> None:
        _check_choice("model.arch", self.arch, ARCHS)
        _check_choice("model.source", self.source, MODEL_SOURCES)
        if self.source == "local" and not self.local_path:
            raise ConfigError("model.source=local needs model.local_path=/path/to/model/dir")


@dataclass(frozen=True)
class HardwareConfig:
    name: str
    description: str
    device: str
    precisions: tuple[str, ...]
    threads: int | None = None

    def validate(self) -> None:
        _check_choice("hardware.device", self.device, DEVICES)
        if self.threads is not None and self.threads < 1:
            raise ConfigError(f"hardware.threads={self.threads} must be at least 1 (or null for every core)")


@dataclass(frozen=True)
class PrecisionConfig:
    name: str
    dtype: str
    method: str = "none"

    def validate(self) -> None:
        _check_choice("precision.dtype", self.dtype, DTYPES)
        _check_choice("precision.method", self.method, QUANT_METHODS)


@dataclass(frozen=True)
class DraftConfig:
    name: str
    kind: str = "none"

    def validate(self) -> None:
        _check_choice("draft.kind", self.kind, DRAFT_KINDS)


@dataclass(frozen=True)
class TaskConfig:
    name: str
    kind: str
    max_new_tokens: int
    code_max_new_tokens: int
    exact_new_tokens: bool
    prompt_lengths: tuple[int, ...] = ()
    limit: int | None = None
    warmup: int = 1

    def validate(self) -> None:
        _check_choice("task.kind", self.kind, TASK_KINDS)
        for key in ("max_new_tokens", "code_max_new_tokens"):
            if getattr(self, key) < 1:
                raise ConfigError(f"task.{key}={getattr(self, key)} must be at least 1")
        if self.kind == "benchmark" and not self.prompt_lengths:
            raise ConfigError("task.prompt_lengths is empty: a benchmark needs at least one prompt length")
        if any(n < 1 for n in self.prompt_lengths):
            raise ConfigError(f"task.prompt_lengths={list(self.prompt_lengths)} must all be at least 1")
        if self.limit is not None and self.limit < 1:
            raise ConfigError(f"task.limit={self.limit} must be at least 1 (or null for every example)")
        if self.warmup < 0:
            raise ConfigError(f"task.warmup={self.warmup} must be 0 or more")

    def new_tokens_for(self, model: ModelConfig) -> int:
        return self.code_max_new_tokens if model.code else self.max_new_tokens


@dataclass(frozen=True)
class DatasetConfig:
    name: str
    source: str
    path: str | None = None
    hf_id: str | None = None
    hf_subset: str | None = None
    split: str | None = None

    def validate(self) -> None:
        _check_choice("dataset.source", self.source, DATASET_SOURCES)
        if self.source == "textfile" and not self.path:
            raise ConfigError("dataset=textfile needs dataset.path=/path/to/corpus.txt")
        if self.source == "hf" and not self.hf_id:
            raise ConfigError("dataset.source=hf needs dataset.hf_id")


@dataclass(frozen=True)
class SamplingConfig:
    do_sample: bool = False
    temperature: float = 1.0
    top_p: float = 1.0
    seed: int = 0

    def validate(self) -> None:
        if self.temperature <= 0:
            raise ConfigError(f"sampling.temperature={self.temperature} must be above 0")
        if not 0 < self.top_p <= 1:
            raise ConfigError(f"sampling.top_p={self.top_p} must be in (0, 1]")


@dataclass(frozen=True)
class TrackingConfig:
    kind: str
    uri: str | None = None

    def validate(self) -> None:
        _check_choice("tracking.kind", self.kind, TRACKING_KINDS)
        if self.kind == "server" and not self.uri:
            raise ConfigError("tracking=server needs tracking.uri=http://host:port")


@dataclass(frozen=True)
class JobConfig:
    model: ModelConfig
    hardware: HardwareConfig
    precision: PrecisionConfig
    draft: DraftConfig
    task: TaskConfig
    dataset: DatasetConfig
    tracking: TrackingConfig
    sampling: SamplingConfig = field(default_factory=SamplingConfig)
    cache_dir: Path = Path("~/.cache/quantspec")
    experiment: str = "quantspec"

    def validate(self) -> None:
        for part in (self.model, self.hardware, self.precision, self.draft, self.task, self.dataset,
                     self.tracking, self.sampling):
            part.validate()

    def unsupported_reason(self) -> str | None:
        """Why this hardware cannot run this precision, or None. Not an error: the sweep records a skip."""
        if self.precision.name not in self.hardware.precisions:
            return (f"{self.hardware.name} has no {self.precision.name} kernels "
                    f"(it supports {', '.join(self.hardware.precisions)})")
        return None


_SECTIONS = {
    "model": ModelConfig, "hardware": HardwareConfig, "precision": PrecisionConfig, "draft": DraftConfig,
    "task": TaskConfig, "dataset": DatasetConfig, "tracking": TrackingConfig, "sampling": SamplingConfig,
}


def _build(section: str, cls: type, raw: Mapping[str, Any]) -> Any:
    names = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(raw) - names)
    if unknown:
        raise ConfigError(f"{section} has unknown key(s) {', '.join(unknown)}; known: {', '.join(sorted(names))}")
    missing = sorted(f.name for f in dataclasses.fields(cls)
                     if f.name not in raw and f.default is dataclasses.MISSING
                     and f.default_factory is dataclasses.MISSING)
    if missing:
        raise ConfigError(f"{section} is missing {', '.join(missing)}")
    # YAML lists arrive as lists; the frozen dataclasses keep tuples so configs stay hashable.
    values = {k: tuple(v) if isinstance(v, list) else v for k, v in raw.items()}
    return cls(**values)


def job_config_from_dict(raw: Mapping[str, Any]) -> JobConfig:
    """Build and validate a JobConfig from a plain (resolved) dict of the composed config."""
    parts = {}
    for section, cls in _SECTIONS.items():
        if section not in raw and section == "sampling":
            parts[section] = SamplingConfig()
            continue
        if section not in raw or raw[section] is None:
            raise ConfigError(f"the config has no '{section}' group; check conf/config.yaml's defaults")
        parts[section] = _build(section, cls, raw[section])
    job = JobConfig(**parts,
                    cache_dir=Path(str(raw.get("cache_dir", "~/.cache/quantspec"))).expanduser(),
                    experiment=str(raw.get("experiment", "quantspec")))
    job.validate()
    return job
