"""`engine=ort_genai`: ONNX Runtime GenAI (its model builder's export), a Runtime (src.engine.config) named by conf/engine/ort_genai.yaml's `module`. Its code is
runtime.py (what it runs, exports and says); this package holds it and its helpers."""

from src.engine.runtimes.ort_genai.runtime import (
    PRECISIONS,
    TITLE,
    OrtGenAI,
    available,
    build,
    export,
    runtime_name,
    unsupported,
)

__all__ = ["PRECISIONS", "TITLE", "OrtGenAI", "available", "build", "export", "runtime_name", "unsupported"]
