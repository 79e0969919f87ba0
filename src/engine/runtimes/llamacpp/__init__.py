"""`engine=llamacpp`: llama.cpp (llama-cpp-python, an optional extra), a Runtime (src.engine.config) named by conf/engine/llamacpp.yaml's `module`. Its code is
runtime.py (what it runs, exports and says); this package holds it and its helpers."""

from src.engine.runtimes.llamacpp.runtime import *  # noqa: F403 - the Runtime's names (runtime.py's __all__)
from src.engine.runtimes.llamacpp.runtime import __all__  # noqa: F401
