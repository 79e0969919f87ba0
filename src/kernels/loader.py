"""Building, checking and loading quantspec's kernel libraries (the package's docstring says what they are): each
variant and the binding built once per machine and torch version into the one verified cache (src.common.cache: a
build under a lock, in a scratch folder renamed into place, every file's sha256 checked before each load, since a
truncated or damaged .so can crash the process inside dlopen), the best variant this CPU runs chosen, or why none
could be."""

from __future__ import annotations

import functools
import hashlib
import logging
import os
from pathlib import Path

from src.common.cache import FORMAT as CACHE_FORMAT
from src.common.cache import build_cached
from src.common.descendants import ended_on_error
from src.kernels import variants

log = logging.getLogger(__name__)
BINDING = "quantspec_kernels"
HERE = Path(__file__).parent
# Up to this many rows (a step, a verification of up to 15 drafts) these kernels run; above it (a
# prefill) ATen's blocked GEMMs win, as these re-read W per few rows. It must cover every verification:
# a row's result must not depend on how many rows come together, or a draft could change greedy output.
MAX_ROWS = 16

_state: dict[str, object] = {}


class IsaUnavailable(ValueError):
    """engine.isa names a variant this machine cannot run."""


def _key(*parts: bytes) -> str:
    import torch  # here, not at import: scripts set the ISA environment torch reads before loading it

    return hashlib.sha256(b"".join(parts) + torch.__version__.encode()).hexdigest()[:16]


def candidates(isa: str, features: set[str] | None = None, arch: str | None = None) -> list[variants.Variant]:
    """The variants to try for engine.isa, best first: every one this CPU runs for `auto`, else the one
    named (IsaUnavailable, one line, if this CPU lacks what it needs)."""
    features = variants.cpu_features() if features is None else features
    runnable = [v for v in variants.for_arch(arch) if not variants.missing(v, features, arch)]
    if isa == "auto":
        return runnable
    if isa not in variants.NAMES:
        raise IsaUnavailable(
            f"engine.isa={isa!r} is no kernel variant; choose auto or one of: {', '.join(variants.NAMES)}"
        )
    lacks = variants.missing(variants.by_name(isa), features, arch)
    if lacks:
        raise IsaUnavailable(
            f"engine.isa={isa}: this CPU lacks {', '.join(lacks)}; choose engine.isa=auto or one "
            f"of: {', '.join(v.name for v in runnable)}"
        )
    return [variants.by_name(isa)]


def load(directory: Path, isa: str = "auto") -> bool:
    """Build (once) and load the binding and the variant for `isa`. True when a variant is in use."""
    # IsaUnavailable goes to the caller: a config error, not a slower run
    return load_variants(directory, candidates(isa))


def load_variants(directory: Path, chosen: list[variants.Variant]) -> bool:
    """load() for the first of `chosen` that this CPU runs and that builds (the tests and scripts load
    variants.AVX_VNNI_TWIN through it). A variant whose instructions the CPU lacks is never loaded: its
    first call would kill the process (SIGILL), so it is passed over with that reason."""
    directory = Path(directory).expanduser()
    if not _state.get("binding"):
        reason = _load_binding(directory)
        if reason:
            _state.update(ok=False, reason=reason, variant=None)
            return False
        _state["binding"] = True
    skipped, features = [], variants.cpu_features()
    for variant in chosen:
        lacks = variants.missing(variant, features)
        if lacks:
            skipped.append(f"{variant.name}: this CPU lacks {', '.join(lacks)}")
            continue
        try:
            path = built_variant(variant, directory)
            # the variants below it too: the kernels it has none of its own for are taken from them (core/api.h)
            below = _built_below(variant, features, directory)
        except Exception as err:  # an old compiler without these flags: the next variant down
            skipped.append(
                f"{variant.name}: {str(err).strip().splitlines()[-1] if str(err).strip() else type(err).__name__}"
            )
            continue
        import torch  # after the ISA environment a script sets (see _key)

        name = torch.ops.quantspec.use_variant(str(path), [str(p) for p in below])
        _state.update(ok=True, reason="; ".join(skipped) or None, variant=name)
        if skipped:
            log.warning("kernel variants not built here (%s); %s runs", "; ".join(skipped), name)
        return True
    _state.update(ok=False, reason="; ".join(skipped) or "no kernel variant for this CPU", variant=None)
    return False


def _built_below(variant: variants.Variant, features: set[str], directory: Path) -> list[Path]:
    """The libraries of the variants below `variant` that fill its missing kernels (variants.fallbacks), those this
    compiler cannot build passed over (the reference variant, plain C++, always builds): an old compiler without
    -mavxvnni must not cost an AVX-512 host its own variant."""
    built = []
    for below in variants.fallbacks(variant, features):
        try:
            built.append(built_variant(below, directory))
        except Exception:
            if below.name == "reference":
                raise
    return built


def binding_folder(directory: Path) -> Path:
    """Where the binding built from these sources, by this torch, lives under `directory`."""
    sources = [
        HERE / "binding.cpp",
        HERE / "step.cpp",
        HERE / "ops.h",
        HERE / "core" / "api.h",
        HERE / "core" / "amx.h",
        HERE / "core" / "common.h",
        Path(__file__),
    ]  # this file: the build's flags
    return Path(directory) / f"binding-{_key(*(p.read_bytes() for p in sources))}"


def variant_folder(variant: variants.Variant, directory: Path, cxx: str) -> Path:
    """Where `variant` built from these sources and flags, by compiler `cxx`, lives under `directory`."""
    key = _key(
        *(p.read_bytes() for p in variants.sources(variant)),
        " ".join(variants.build_flags(variant)).encode(),
        cxx.encode(),
        f"cache {CACHE_FORMAT}".encode(),  # a folder of another cache format is not this one's to judge
    )
    return Path(directory) / f"{variant.name}-{key}"


def _want(library: str) -> dict:
    """What a kernel library's cache is built for (its folder's name keys the sources, flags and compiler)."""
    import torch  # after the ISA environment a script sets (see _key)

    return {"kernels": library, "torch": torch.__version__}


def _load_binding(directory: Path) -> str | None:
    """The torch binding (no ISA code): built with torch's extension builder. None, or why it failed."""
    if variants.compiler() is None:
        return "no C++ compiler (install g++ or set CXX)"
    import torch  # after the ISA environment a script sets (see _key)

    folder, built_here = binding_folder(directory), []

    def build(out: Path) -> None:
        _build_binding(out)
        built_here.append(True)

    try:
        build_cached(folder, build, _want(BINDING), "kernel library")
        if not built_here:  # torch's builder loads what it builds; a cached one is loaded here
            torch.ops.load_library(str(folder / f"{BINDING}.so"))
    except Exception as err:  # no compiler or no ninja: a slower run, not a failed one
        last = str(err).strip().splitlines()
        return f"could not build src/kernels ({last[-1] if last else type(err).__name__})"
    return None


def _build_binding(out: Path) -> None:
    """Build the binding into `out` with torch's extension builder (which also loads it into this process), and
    keep only the library: the objects and ninja files are the builder's, not the cache's."""
    from torch.utils import cpp_extension  # after the ISA environment a script sets (see _key)

    # -fopenmp: at::parallel_for is inline OpenMP in torch's headers; without it every call runs on one thread.
    # -ffp-contract=off: step.cpp rounds each product and sum as ATen does; a fused multiply-add (Arm's
    # baseline has one) would round once and the C++ step would drift from the Python one.
    with ended_on_error():  # a stop mid-build ends ninja's compilers too, not only ninja
        _torch_build(cpp_extension, out)
    for path in out.iterdir():
        if path.name != f"{BINDING}.so" and path.is_file():
            path.unlink()


def _torch_build(cpp_extension, out: Path) -> None:
    cpp_extension.load(
        name=BINDING,
        sources=[str(HERE / "binding.cpp"), str(HERE / "step.cpp")],
        extra_cflags=["-O2", "-fopenmp", "-ffp-contract=off"],
        extra_ldflags=["-fopenmp"],
        build_directory=str(out),
        is_python_module=False,
        verbose=bool(os.environ.get("QUANTSPEC_VERBOSE_BUILD")),
    )


def built_variant(variant: variants.Variant, directory: Path) -> Path:
    """The variant's library, compiled once (a few seconds) into its own folder of the verified cache."""
    cxx = variants.compiler()
    if cxx is None:
        raise RuntimeError("no C++ compiler")
    folder = variant_folder(variant, directory, cxx)
    library = f"qs_{variant.name}.so"
    build_cached(
        folder, lambda out: variants.compile_variant(variant, out / library, cxx), _want(library), "kernel library"
    )
    return folder / library


@functools.cache
def _formats() -> tuple[str, ...]:
    """core/api.h's QS_FORMATS as the loaded binding lists them (fixed once it is loaded: asked once)."""
    import torch  # after the ISA environment a script sets (see _key)

    return tuple(torch.ops.quantspec.formats())


def format_number(name: str) -> int:
    """A weight format's number in the kernels' list (core/api.h's QS_FORMATS, read through the binding, so
    Python and C++ never disagree): what the grouped ops and the C++ step take. ValueError if it has none."""
    names = _formats()
    if name not in names:
        raise ValueError(f"weight format {name!r} has no kernels in core/api.h (they have: {', '.join(names)})")
    return names.index(name)


def loaded() -> bool:
    """True once load() has succeeded in this process."""
    return bool(_state.get("ok"))


def binding_op(name: str):
    """torch.ops.quantspec.<name> where the binding is loaded in this process (a job that runs quantspec's kernels
    loads it before it quantizes), else None: callers then run the same arithmetic in torch."""
    import torch  # (as _key: not at import)

    try:
        return getattr(torch.ops.quantspec, name)
    except (AttributeError, RuntimeError):
        return None


def reason() -> str | None:
    """Why load() returned False (or which variants could not be built)."""
    return _state.get("reason")  # type: ignore[return-value]


def variant() -> str | None:
    """The variant in use ('avx512', 'avx_vnni', 'avx2', ..., 'reference'), or None."""
    return _state.get("variant") if _state.get("ok") else None  # type: ignore[return-value]
