"""`engine=openvino`: OpenVINO (optimum-intel's export, NNCF's quantization), a Runtime (src.engine.config) named by conf/engine/openvino.yaml's `module`. Its code is
runtime.py (what it runs, exports and says); this package holds it and its helpers."""

from src.engine.runtimes.openvino.runtime import *  # noqa: F403 - the Runtime's names (runtime.py's __all__)
from src.engine.runtimes.openvino.runtime import __all__  # noqa: F401
