"""`engine=ort_genai`: ONNX Runtime GenAI (its model builder's export), a Runtime (src.engine.config) named by conf/engine/ort_genai.yaml's `module`. Its code is
runtime.py (what it runs, exports and says); this package holds it and its helpers."""

from src.engine.runtimes.ort_genai.runtime import *  # noqa: F403 - the Runtime's names (runtime.py's __all__)
from src.engine.runtimes.ort_genai.runtime import __all__  # noqa: F401
