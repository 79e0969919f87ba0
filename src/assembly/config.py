"""Typed configuration: the composed Hydra config becomes these dataclasses once, at the entry point.

Everything downstream takes these objects, never a DictConfig. Validation names the field, the allowed
values and the value received, so a bad sweep fails with one line a user can act on.

Each axis's config class lives with what it configures (src.models.config, src.quant.config,
src.engine.config, src.data.config, src.tasks.kinds); this module composes them into a JobConfig and holds
the sections that are the job's own (hardware, draft, tracking). The axes with kinds are built from their
registries (src.common.schema.Kinds): a precision's spec from src.quant.methods.METHODS by
precision.method, a task from src.tasks.kinds.TASKS by task.kind, an engine from src.engine.config.ENGINES
(or RuntimeEngine, where it names a module), a store from TRACKING. Each keeps only its kind's fields; the
YAML's other kinds' fields (conf/<axis>/_fields.yaml) are left out.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

from src.common.schema import ConfigError, Kinds, check_choice, check_range
from src.data.config import PROMPT_SOURCES, DatasetConfig
from src.engine.config import ENGINES, EngineConfig, RuntimeEngine, Sampling
from src.engine.runtimes import runtime
from src.engine.speculative import DRAFTERS
from src.models.config import ARCHS, OTHER, ModelConfig
from src.quant import formats
from src.quant import methods as quant_methods
from src.quant.config import DTYPES, PrecisionConfig
from src.quant.methods import METHODS
from src.tasks.kinds import TASKS, TaskConfig

DEVICES = ("cpu", "cuda", "npu")
DRAFT_KINDS = ("none", *DRAFTERS)  # no draft, or one of the registered drafters
DRAFT_SCHEDULES = ("constant", "heuristic")
MAX_DRAFT_K = 15  # a verification of k + 1 tokens stays on the engine's step path and kernels (16 rows)
UNREACHABLE = ("fail", "journal")
MAX_EXPERIMENT_CHARS = 200
MAX_THREADS = 4096
MAX_ROUNDS = 1000  # a sweep's rounds (each a run of every job); more is a typo, not a plan
MAX_METRICS_S = 3600  # the system-metrics sampler waits this long between samples (a wait past it overflows)


@dataclass(frozen=True)
class HardwareConfig:
    name: str  # the profile's name (conf/hardware/<name>.yaml)
    description: str  # what the profile is, in words
    device: str  # cpu, cuda or npu: what its kernels were built for
    dtypes: tuple[str, ...]  # the float dtypes it runs (a float precision's)
    threads: int | None = None  # threads a job runs with; null: every core
    resource: str = ""  # the Ray resource of the nodes that have this hardware, e.g. hw-stx
    lacks: tuple[str, ...] = ()  # the quantized formats (src.quant.formats) its silicon has no kernels for

    def validate(self) -> None:
        check_choice("hardware.device", self.device, DEVICES)
        for name in self.lacks:
            check_choice("hardware.lacks", name, formats.names())
        for dtype in self.dtypes:
            check_choice("hardware.dtypes", dtype, DTYPES)
        if self.threads is not None and self.threads < 1:
            raise ConfigError(f"hardware.threads={self.threads} must be at least 1 (or null for every core)")
        if self.threads is not None:  # torch.set_num_threads takes a C int; no host has more cores than this
            check_range("hardware.threads", self.threads, 1, MAX_THREADS, "null: every core")


@dataclass(frozen=True)
class DraftConfig:
    name: str  # the choice's name (conf/draft/<name>.yaml)
    kind: str = "none"
    k: int = 4  # proposals per verification step (the start, under a heuristic schedule)
    schedule: str = "constant"  # constant | heuristic
    k_max: int = 8  # the heuristic schedule's ceiling
    max_ngram: int = 3  # kind=prompt_lookup: the longest n-gram matched
    min_ngram: int = 1  # kind=prompt_lookup: the shortest n-gram matched
    baseline: bool = True  # also time each example without the draft, for the speedup
    vocab: int | None = None  # kind=model: the draft scores only the corpus's N most frequent tokens

    @property
    def active(self) -> bool:
        return self.kind != "none"

    def validate(self) -> None:
        check_choice("draft.kind", self.kind, DRAFT_KINDS)
        check_choice("draft.schedule", self.schedule, DRAFT_SCHEDULES)
        if not 1 <= self.k <= MAX_DRAFT_K or not self.k <= self.k_max <= MAX_DRAFT_K:
            raise ConfigError(
                f"draft.k={self.k} and draft.k_max={self.k_max} must satisfy 1 <= k <= k_max <= {MAX_DRAFT_K}"
            )
        if not 1 <= self.min_ngram <= self.max_ngram:
            raise ConfigError(
                f"draft.min_ngram={self.min_ngram} and draft.max_ngram={self.max_ngram} must satisfy "
                f"1 <= min_ngram <= max_ngram"
            )
        if self.vocab is not None and (self.kind != "model" or self.vocab < 1):
            raise ConfigError(f"draft.vocab={self.vocab} needs a draft model (draft.kind=model) and at least 1 token")


TRACKING = Kinds("tracking", "kind")


@dataclass(frozen=True, kw_only=True)
class TrackingConfig:
    KIND: ClassVar[str]
    unreachable: str  # a store unreachable at start: fail in seconds, or journal and sync later
    system_metrics_s: float  # MLflow system metrics every N seconds; 0: off
    busy_cores: float  # others' CPU (cores) while timed above which a job is tagged host_busy
    uri: str | None = None  # tracking=server: the server's address (http://host:port)

    @property
    def kind(self) -> str:
        return self.KIND

    def validate(self) -> None:
        if self.system_metrics_s < 0 or self.busy_cores < 0:
            raise ConfigError("tracking.system_metrics_s and tracking.busy_cores must be 0 or more")
        check_range("tracking.system_metrics_s", self.system_metrics_s, 0, MAX_METRICS_S, "0: off")
        check_choice("tracking.unreachable", self.unreachable, UNREACHABLE)


@TRACKING.register
@dataclass(frozen=True, kw_only=True)
class SqliteTracking(TrackingConfig):
    """One SQLite file (uri null: the project's mlflow.db)."""

    KIND: ClassVar[str] = "sqlite"


@TRACKING.register
@dataclass(frozen=True, kw_only=True)
class ServerTracking(TrackingConfig):
    """A running MLflow tracking server."""

    KIND: ClassVar[str] = "server"

    def validate(self) -> None:
        super().validate()
        if not self.uri:
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
    engine: EngineConfig | RuntimeEngine
    sampling: Sampling = field(default_factory=Sampling)
    draft_model: ModelConfig | None = None  # draft.kind=model: what drafts, at which precision
    draft_precision: PrecisionConfig | None = None
    cache_dir: Path = Path("~/.cache/quantspec")
    experiment: str = "quantspec"
    resume: bool = True  # a rerun into a sweep's directory keeps the jobs it already finished

    def validate(self) -> None:
        for part in (
            self.model,
            self.hardware,
            self.precision,
            self.draft,
            self.task,
            self.dataset,
            self.tracking,
            self.engine,
            self.sampling,
        ):
            part.validate()
        name = self.experiment
        if not name.strip() or len(name) > MAX_EXPERIMENT_CHARS or not name.isprintable():
            raise ConfigError(
                f"experiment={name[:40]!r}{'...' if len(name) > 40 else ''} must be 1 to "
                f"{MAX_EXPERIMENT_CHARS} printable characters (it names the MLflow experiment)"
            )
        if self.cache_dir.exists() and not self.cache_dir.is_dir():
            raise ConfigError(
                f"cache_dir={self.cache_dir} is a file, not a directory; point QUANTSPEC_CACHE "
                f"(or cache_dir=) at a directory"
            )
        if self.model.arch == OTHER:  # a family whose layers quantspec does not map (src.assembly.ownmodel)
            family = f"{self.model.name} ({self.model.model_type or 'another family'})"
            if self.precision.quantized:
                raise ConfigError(
                    f"{family} is quantized only where quantspec maps its layers ({', '.join(ARCHS)}); "
                    f"run it at precision=fp32 or bf16"
                )
            if self.engine.kind == "native":
                raise ConfigError(f"{family} runs on transformers' generate, not quantspec's engine: use engine=hf")
        if self.precision.quantized:
            self.precision.spec(self.model)  # the method finds what it takes from the model (or says so)
        self.task.check_job(self)
        if self.draft.active and self.engine.kind != "native":
            raise ConfigError(f"draft={self.draft.name} runs on quantspec's engine; use engine=native")
        if self.draft.kind == "model":
            if self.draft_model is None or self.draft_precision is None:
                raise ConfigError(f"draft={self.draft.name} has no resolved model and precision")
            self.draft_model.validate()
            self.draft_precision.validate()
            if self.draft_precision.quantized:
                self.draft_precision.spec(self.draft_model)

    def _no_kernels(self, precision: PrecisionConfig, role: str = "") -> str | None:
        """Why this hardware cannot run `precision`: a quantized one by its layers' format (a profile names the
        formats it lacks, so a new precision or a new format runs on every profile that does not name it), a
        float one by its dtype."""
        hw = self.hardware
        says = f"(it lacks {', '.join(hw.lacks) or 'no format'}; its float dtypes: {', '.join(hw.dtypes)})"
        if precision.quantized and precision.quant.format in hw.lacks:
            return f"{hw.name} has no {precision.quant.format} kernels{role} {says}"
        if not precision.quantized and precision.dtype not in hw.dtypes:
            return f"{hw.name} has no {precision.name} kernels{role} ({precision.dtype}) {says}"
        return None

    def unsupported_reason(self) -> str | None:
        """Why this hardware cannot run this precision, or None. Not an error: the sweep records a skip."""
        reason = self._no_kernels(self.precision)
        if reason is None and self.draft_precision is not None:
            reason = self._no_kernels(self.draft_precision, " for the draft")
        if reason is not None:
            return reason
        if self.draft.active and not self.task.DECODES:
            return f"task {self.task.name} does not decode: draft {self.draft.name} would change nothing"
        other = runtime(self.engine)
        return other.unsupported(self) if other is not None else None


# Sections of one class; the axes with kinds (precision, task, engine, tracking) are built by _kind_of.
_SECTIONS = {
    "model": ModelConfig,
    "hardware": HardwareConfig,
    "draft": DraftConfig,
    "dataset": DatasetConfig,
    "sampling": Sampling,
}
AXIS_KINDS = {"task": TASKS, "tracking": TRACKING}  # the axes chosen by their selector alone
_SECTION_ORDER = ("model", "hardware", "precision", "draft", "task", "dataset", "tracking", "engine", "sampling")


def _fields(cls: type) -> set[str]:
    return {f.name for f in dataclasses.fields(cls)}


def _build(
    section: str,
    cls: type,
    raw: Mapping[str, Any],
    known: set[str] | None = None,
    extra: Mapping[str, Any] | None = None,
) -> Any:
    """cls from raw, its fields type-checked. `known`: the keys the section may hold (every kind's fields,
    for an axis with kinds); those that are not cls's own belong to another kind and are left out."""
    names = _fields(cls) - set(extra or {})
    unknown = sorted(set(raw) - (names if known is None else known))
    if unknown:
        allowed = names if known is None else known
        raise ConfigError(f"{section} has unknown key(s) {', '.join(unknown)}; known: {', '.join(sorted(allowed))}")
    raw = {k: v for k, v in raw.items() if k in names}
    missing = sorted(
        f.name
        for f in dataclasses.fields(cls)
        if f.name in names
        and f.name not in raw
        and f.default is dataclasses.MISSING
        and f.default_factory is dataclasses.MISSING
    )
    if missing:
        raise ConfigError(f"{section} is missing {', '.join(missing)}")
    # composition typed every field (src.assembly.schema); a float may still be nan or inf, which every
    # comparison passes over, so a check against it would switch itself off
    for key, value in raw.items():
        if isinstance(value, float) and not math.isfinite(value):
            raise ConfigError(f"{section}.{key}={value!r} must be a finite number")
    # YAML lists arrive as lists; the frozen dataclasses keep tuples so configs stay hashable.
    values = {k: tuple(v) if isinstance(v, list) else v for k, v in raw.items()}
    return cls(**values, **(extra or {}))


def _kind_of(section: str, kinds: Kinds, raw: Mapping[str, Any]) -> Any:
    """A section of an axis with kinds: the class its selector names, from that class's own fields."""
    raw = dict(raw)
    cls = kinds[raw.pop(kinds.selector, None)]
    return _build(section, cls, raw, kinds.field_names())


def _precision(section: str, raw: Mapping[str, Any]) -> PrecisionConfig:
    """The precision's own fields, and its method's spec from the method's fields (none: no spec)."""
    method = raw.get("method")
    check_choice(f"{section}.method", method, quant_methods.choices())
    own = _fields(PrecisionConfig) - {"quant"}
    known = own | METHODS.field_names()
    quant = None
    if method != "none":
        spec = {k: v for k, v in raw.items() if k not in own or k == "method"}
        quant = _build(section, METHODS[method], spec, known)
    return _build(section, PrecisionConfig, raw, known, extra={"quant": quant})


def _engine(raw: Mapping[str, Any]) -> Any:
    """quantspec's own engine by its kind, or another runtime where the engine names its module."""
    if raw.get("module") is not None:
        return _build("engine", RuntimeEngine, raw, _fields(RuntimeEngine) | ENGINES.field_names())
    return _kind_of("engine", ENGINES, {k: v for k, v in raw.items() if k != "module"})


def unread(group: str, entry: Mapping[str, Any], key: str) -> str | None:
    """Where a group's entry (its composed YAML) has `key` but its kind's config does not read it: the
    kinds that do, in words (e.g. "precision.method awq"); None where it reads it, or the group has no kinds."""
    if group == "precision":
        method = METHODS.get(entry.get("method"))
        if key in _fields(PrecisionConfig) or (method is not None and key in _fields(method)):
            return None
        return f"precision.method {' or '.join(METHODS.owners(key))}"
    kinds = {**AXIS_KINDS, "engine": ENGINES}.get(group)
    if kinds is None or key == kinds.selector:
        return None
    if group == "engine" and entry.get("module") is not None:
        return None if key in _fields(RuntimeEngine) else "quantspec's own engines (hf, native)"
    cls = kinds.get(entry.get(kinds.selector))
    if cls is None or key in _fields(cls):
        return None
    return f"{group}.{kinds.selector} {' or '.join(kinds.owners(key))}" if kinds.owners(key) else None


def reads_dataset(raw: Mapping[str, Any]) -> bool:
    """Whether a composed job (its plain dict) reads the dataset group's text: a task that cuts prompts or windows
    from it, or takes its prompts from a prompts file (decode, dataset=jsonl), a precision (the target's or a model draft's) that calibrates on it, or another runtime, which may
    calibrate its own export on it. Where none does, the dataset is neither a setting to give nor one to record."""
    task = TASKS.get((raw.get("task") or {}).get("kind"))
    if task is not None and task.READS_DATASET:
        return True
    if task is not None and task.READS_PROMPTS and (raw.get("dataset") or {}).get("source") in PROMPT_SOURCES:
        return True
    draft = raw.get("draft") or {}
    for precision in (raw.get("precision"), draft.get("precision") if draft.get("kind") == "model" else None):
        method = METHODS.get((precision or {}).get("method"))
        if method is not None and (method.CALIBRATES or (precision or {}).get("gptq")):
            return True
    return (raw.get("engine") or {}).get("module") is not None and (raw.get("precision") or {}).get("method") != "none"


def hardware_config(raw: Mapping[str, Any]) -> HardwareConfig:
    """A hardware profile alone (the Ray launcher places each job by its resource before the job runs)."""
    hardware = _build("hardware", HardwareConfig, raw)
    hardware.validate()
    return hardware


def _section(section: str, raw: Mapping[str, Any]) -> Any:
    if section == "precision":
        return _precision(section, raw)
    if section in AXIS_KINDS:
        return _kind_of(section, AXIS_KINDS[section], raw)
    if section == "engine":
        return _engine(raw)
    return _build(section, _SECTIONS[section], raw)


def job_config_from_dict(raw: Mapping[str, Any]) -> JobConfig:
    """Build and validate a JobConfig from a plain (resolved) dict of the composed config. A draft model's
    model and precision are composed into the draft's section (draft.model, draft.precision); null there
    means the target's own."""
    parts = {}
    raw = dict(raw)
    draft_model = draft_precision = None
    if raw.get("draft"):
        raw["draft"] = dict(raw["draft"])
        draft_model, draft_precision = raw["draft"].pop("model", None), raw["draft"].pop("precision", None)
    for section in _SECTION_ORDER:
        if section not in raw and section == "sampling":
            continue  # greedy
        if section not in raw or raw[section] is None:
            raise ConfigError(f"the config has no '{section}' group; check conf/config.yaml's defaults")
        parts[section] = _section(section, raw[section])
    if parts["draft"].kind == "model":
        if draft_model is None and draft_precision is None:
            raise ConfigError(
                f"draft {parts['draft'].name}: a self-draft needs a precision of its own, e.g. "
                f"precision@draft.precision=w4a16 (or a model: +model@draft.model=...)"
            )
        parts["draft_model"] = _build("draft.model", ModelConfig, draft_model) if draft_model else parts["model"]
        if parts["model"].weights == "random":  # a real draft could not agree with a random target anyway
            parts["draft_model"] = dataclasses.replace(parts["draft_model"], weights="random")
        parts["draft_precision"] = (
            _precision("draft.precision", draft_precision) if draft_precision else parts["precision"]
        )
    resume = raw.get("resume", True)
    job = JobConfig(
        **parts,
        cache_dir=Path(str(raw.get("cache_dir", "~/.cache/quantspec"))).expanduser(),
        experiment=str(raw.get("experiment", "quantspec")),
        resume=resume,
    )
    job.validate()
    return job


@dataclass(frozen=True)
class SweepSettings:
    """What a sweep's sweeper, launchers and callbacks read of the composed config (each job reads its own
    JobConfig): converted once from Hydra's config by src.assembly.sweep_settings.sweep_of."""

    sweep_dir: Path
    experiment: str
    tracking: TrackingConfig
    report_at_end: bool = True
    resume: bool = True
    rounds: int = 1  # interleaved rounds of every job (src.tracking.sweep.rounds)
    busy_reruns: int = 0  # rounds measured again at most, where a round ran on a busy host


def sweep_settings(raw: Mapping[str, Any], sweep_dir: Path) -> SweepSettings:
    """The sweep's settings from the plain (resolved) top of the composed config."""
    values = {k: raw[k] for k in ("report_at_end", "resume", "rounds", "busy_reruns") if k in raw}
    for key in ("rounds", "busy_reruns"):  # composition typed them (src.assembly.schema); their ranges are ours
        if key in values and values[key] < (1 if key == "rounds" else 0):
            raise ConfigError(
                f"{key} must be a whole number >= {1 if key == 'rounds' else 0} (got {key}={values[key]!r}); "
                f"e.g. rounds=3"
            )
    for key, low in (("rounds", 1), ("busy_reruns", 0)):
        if key in values:
            check_range(key, values[key], low, MAX_ROUNDS, "each round times every job of the sweep again")
    if raw.get("tracking") is None:
        raise ConfigError("the config has no 'tracking' group; check conf/config.yaml's defaults")
    return SweepSettings(
        Path(sweep_dir).resolve(),
        str(raw.get("experiment", "quantspec")),
        _kind_of("tracking", TRACKING, raw["tracking"]),
        **values,
    )
