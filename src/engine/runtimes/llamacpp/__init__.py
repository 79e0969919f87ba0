"""`engine=llamacpp`: llama.cpp (llama-cpp-python, an optional extra), a Runtime (src.engine.config) named by conf/engine/llamacpp.yaml's `module`. Its code is
runtime.py (what it runs, exports and says); this package holds it and its helpers."""

from src.engine.runtimes.llamacpp.runtime import (
    FTYPES,
    TITLE,
    LlamaCpp,
    available,
    build,
    crash_hint,
    export,
    runtime_name,
    unsupported,
)

__all__ = ["FTYPES", "TITLE", "LlamaCpp", "available", "build", "crash_hint", "export", "runtime_name", "unsupported"]
