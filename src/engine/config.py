"""An engine's config: quantspec's own engines (registered in ENGINES, each naming its module), another
runtime (RuntimeEngine, named by its module: src.engine.runtimes), and how tokens are chosen (Sampling)."""

from __future__ import annotations

import importlib
import math
from dataclasses import dataclass
from typing import ClassVar, Protocol, runtime_checkable

import torch
import transformers

from src.common import renames
from src.common.say import message_line
from src.common.schema import ConfigError, Kinds, check_choice
from src.kernels import variants as kernel_variants

ATTENTIONS = ("sdpa", "eager")
KERNEL_CHOICES = ("quantspec", "aten")


# quantspec's kernel variants, as src/kernels/variants.py names them: auto takes the best this CPU runs; a
# name forces one, refused in one line where the CPU lacks it.

ISA_CHOICES = ("auto", *kernel_variants.NAMES)
STEP_PATHS = ("cpp", "python", "static", "transformers")


MIN_TEMPERATURE = 1e-3
ENGINES = Kinds("engine", "kind")  # quantspec's own engines; another runtime is a RuntimeEngine


@dataclass(frozen=True, kw_only=True)
class EngineConfig:
    """quantspec's own engines: the model's forward on torch, with quantspec's kernels where asked."""

    KIND: ClassVar[str]
    MODULE: ClassVar[str]  # its implementation: a module with generate(model, ids, ...) -> Generation
    name: str  # the choice's name (conf/engine/<name>.yaml)
    attention: str  # conf/engine/*.yaml hold the values (measured defaults) and say why
    kernels: str  # quantspec: decode-step matmuls through src/kernels where this CPU runs them
    step_path: str  # quantspec: C++ steps (src.engine.cpp_step), else python's lean loop (src.engine.python_step)
    isa: str = "auto"  # which variant of src/kernels runs (engine.kernels=quantspec)
    adapt_threads: bool = True  # the C++ step picks its thread count per call by measurement (step.cpp)
    compile: bool = False  # the static step through torch.compile (src.engine.static_step.Runner)
    module: ClassVar[None] = None  # not another runtime

    @property
    def kind(self) -> str:
        return self.KIND

    def validate(self) -> None:
        check_choice("engine.attention", self.attention, ATTENTIONS)
        check_choice("engine.kernels", self.kernels, KERNEL_CHOICES)
        renamed = renames.refusal("engine.step_path", self.step_path)  # an engine YAML written before the rename
        if renamed:
            raise ConfigError(renamed)
        check_choice("engine.step_path", self.step_path, STEP_PATHS)
        check_choice("engine.isa", self.isa, ISA_CHOICES)


@ENGINES.register
@dataclass(frozen=True, kw_only=True)
class HfEngine(EngineConfig):
    """transformers' generate: the reference."""

    KIND: ClassVar[str] = "hf"
    MODULE: ClassVar[str] = "src.engine.hf"

    def runtime_name(self) -> str:
        return f"transformers {transformers.__version__} generate, torch {torch.__version__}"

    def validate(self) -> None:
        super().validate()
        if self.step_path != "transformers":
            raise ConfigError(f"engine.step_path={self.step_path} is the native engine's; use engine=native")


@ENGINES.register
@dataclass(frozen=True, kw_only=True)
class NativeEngine(EngineConfig):
    """quantspec's own loop: prefill, steps and k-token verifications over a KV cache (drafts run here)."""

    KIND: ClassVar[str] = "native"
    MODULE: ClassVar[str] = "src.engine.native"

    def runtime_name(self) -> str:
        return f"quantspec native engine, torch {torch.__version__}"


@runtime_checkable
class Runtime(Protocol):
    """What another runtime's module defines (src/engine/runtimes/__init__.py says what each does): a module
    passes when it has these, the functions as functions and TITLE as a string."""

    TITLE: str  # the runtime's name in a failure line

    def unsupported(self, cfg) -> str | None: ...

    def crash_hint(self) -> str: ...  # what to do about a crash of its native code on this host, or ""

    def runtime_name(self, cfg, device: str) -> str: ...

    def build(self, cfg, loaded, placement, corpus, recorder): ...


NAMES = ("unsupported", "runtime_name", "build", "crash_hint")  # Runtime's functions, as a module defines them
RUNTIME_NAMES = ("TITLE", *NAMES)  # every member of a Runtime (a runtime's package exports these)


def check_module(name: str) -> None:
    """engine.module must import (without torch's weight: these modules import their runtime lazily)
    and define NAMES; a ConfigError of one line otherwise."""
    try:
        module = importlib.import_module(name)
    except ImportError as err:
        raise ConfigError(
            f"engine.module={name} does not import ({err}); name a module such as src.engine.runtimes.ort_genai"
        ) from None
    except (Exception, SystemExit) as err:  # noqa: BLE001 - the module's own code failed (or exited) on import
        what = (
            f"exits on import (SystemExit {err.code})"
            if isinstance(err, SystemExit)
            else f"fails on import ({type(err).__name__}: {message_line(err)[:120]})"
        )
        raise ConfigError(
            f"engine.module={name} {what}; fix the module or name another, such as src.engine.runtimes.ort_genai"
        ) from None
    lacking = [n for n in NAMES if not callable(getattr(module, n, None))]
    lacking += [] if isinstance(getattr(module, "TITLE", None), str) else ["TITLE (a string)"]
    if lacking:
        raise ConfigError(
            f"engine.module={name} is no runtime: it lacks {', '.join(lacking)} "
            f"(src/engine/runtimes/__init__.py says what a runtime's module defines)"
        )


@dataclass(frozen=True)
class RuntimeEngine:
    """Another runtime, named by its module (src/engine/runtimes/__init__.py): it brings its own kernels, attention
    and steps, so none of quantspec's engine fields apply."""

    name: str  # the choice's name (conf/engine/<name>.yaml)
    kind: str  # the engine's kind: native, hf, or another runtime's name
    module: str

    def validate(self) -> None:
        check_module(self.module)


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
            raise ConfigError(
                f"sampling.temperature={self.temperature} must be a finite number of at least "
                f"{MIN_TEMPERATURE} (greedy decoding is sampling.do_sample=false)"
            )
        if not (math.isfinite(self.top_p) and 0 < self.top_p <= 1):
            raise ConfigError(f"sampling.top_p={self.top_p} must be in (0, 1]")
        if not 0 <= self.seed < 2**63:
            raise ConfigError(
                f"sampling.seed={self.seed} must be in [0, 2**63) (torch's generator takes a 64-bit seed)"
            )
