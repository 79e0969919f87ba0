"""`engine=openvino`: OpenVINO (optimum-intel's export, NNCF's quantization), a Runtime (src.engine.config) named by conf/engine/openvino.yaml's `module`. Its code is
runtime.py (what it runs, exports and says); this package holds it and its helpers."""

from src.engine.runtimes.openvino.runtime import (
    PRECISIONS,
    TITLE,
    OpenVINO,
    available,
    build,
    export,
    runtime_name,
    unsupported,
)

__all__ = ["PRECISIONS", "TITLE", "OpenVINO", "available", "build", "export", "runtime_name", "unsupported"]
