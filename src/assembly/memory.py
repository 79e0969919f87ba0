"""Will the job fit in memory? Said before anything is loaded, in one line, rather than by the kernel's
OOM killer half an hour into a 7B build.

The estimate follows how a job holds its weights. A quantized job of random weights or of a local checkpoint
(`streams`) makes its float layers one at a time as they are quantized and drops each once rounded
(src.quant.stream): its peak is the larger of quantizing (the float parts outside the layers, one layer, the
method's working set) and running (the quantized weights as the cache stores them, the KV cache). Any other is built whole
(bf16 random weights, a float32 folder) and cast or quantized in place, so the float model is the peak; then a
draft model, the KV cache of the longest example, calibration's logits, and the interpreter with torch and its
libraries. Random weights are
estimated from the shape quantspec ships; a model folder of one's own from its config.json's sizes (a folder
asking for a million layers is refused here, not built until the OOM killer ends it).
"""

from __future__ import annotations

import gc
from types import SimpleNamespace

import psutil
import torch

from src.assembly.config import ConfigError, JobConfig
from src.common import heap
from src.data.corpus import Corpus
from src.engine import kvcache
from src.models import families, hub
from src.models.random_weights import SEED, NoShape, config_of, parameter_count
from src.models.tiny import byte_tokenizer
from src.quant import cache as quant_cache
from src.quant import formats
from src.quant.apply import entry

GB = 2**30
# python, torch, transformers, Hydra, MLflow: ~1.1 GB resident measured here (the bandwidth probe reads the
# step's own weights: src.engine.roofline)
RUNTIME_BYTES = int(1.5 * GB)
DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}


def _shape(cfg: JobConfig):
    """The model's published shape where it is known before loading (random weights), else None."""
    if cfg.model.weights != "random":
        return None
    try:
        return config_of(cfg.model.name)
    except NoShape:
        return None  # load_model says so in its own line


def _kv_bytes(cfg: JobConfig, shape) -> int:
    heads = getattr(shape, "num_key_value_heads", None) or shape.num_attention_heads
    head_dim = getattr(shape, "head_dim", None) or shape.hidden_size // shape.num_attention_heads
    tokens = cfg.task.kv_tokens(cfg.model.code)
    tokens += max(kvcache.MIN_GROWTH, int(tokens * kvcache.GROWTH))  # the cache's room to grow
    return 2 * shape.num_hidden_layers * tokens * heads * head_dim * 2


# model_types whose MLP is two linears, not three: the families' that are so (src.models.families), and others'
UNGATED = (
    *(t for f in families.FAMILIES.values() if not f.gated for t in f.model_types),
    *("gpt2", "gpt_neox", "gptj", "bloom", "falcon", "phi"),
)


def _sizes(config: dict) -> tuple[dict, int, int, int, int, bool]:
    """(the text part of a config.json, hidden size, layers, parameters a layer, vocabulary, tied head), counted from
    its sizes as counted_parameters does."""
    part = config.get("text_config") if isinstance(config.get("text_config"), dict) else config

    def size(*keys, default=0) -> int:
        for key in keys:
            value = part.get(key)
            if isinstance(value, int) and not isinstance(value, bool) and value > 0:
                return value
        return default

    hidden = size("hidden_size", "d_model", "n_embd")
    layers = size("num_hidden_layers", "n_layer", "num_layers")
    heads = size("num_attention_heads", "n_head", default=1)
    kv_heads = size("num_key_value_heads", default=heads)
    head_dim = size("head_dim", default=max(1, hidden // heads))
    inner = size("intermediate_size", "ffn_dim", "n_inner", default=4 * hidden)
    vocab = size("vocab_size")
    tied = part.get("tie_word_embeddings", config.get("tie_word_embeddings", True)) is not False
    attention = 2 * hidden * heads * head_dim + 2 * hidden * kv_heads * head_dim
    mlp = (2 if part.get("model_type", config.get("model_type")) in UNGATED else 3) * hidden * inner
    return part, hidden, layers, attention + mlp, vocab, tied


def counted_parameters(config: dict) -> int:
    """A model config.json's parameters, counted from its sizes without building anything (a meta-device model of
    a million layers takes minutes and gigabytes to build): the embedding and head, and per layer attention
    (q and o at full width, k and v at the key/value heads') and a gated MLP. Within a few percent of the exact
    count for the families quantspec maps; an upper bound's order of magnitude for others."""
    _, hidden, layers, per_layer, vocab, tied = _sizes(config)
    return vocab * hidden * (1 if tied else 2) + layers * per_layer


def streams(cfg: JobConfig) -> bool:
    """Whether the job's model is built hollow and made a layer at a time as it is quantized (src.quant.apply.unmade):
    a quantized precision on quantspec's engines, of random weights or a local checkpoint."""
    own_engine = not cfg.engine.module
    source = cfg.model.weights == "random" or (cfg.model.source in ("hub", "local") and bool(cfg.model.local_path))
    return cfg.precision.quantized and own_engine and source


def _weight_bytes(format_name: str, group: int | None) -> float:
    """Bytes a weight of `format_name` takes stored: its bits, and a float32 scale and offset per group (or a scale
    per row, counted as nothing)."""
    fmt = formats.get(format_name)
    return fmt.bits / 8 + (8 / group if fmt.grouped and group else 0)


def _streamed_bytes(cfg: JobConfig, config: dict, float_bytes: int, stored: int | None) -> int:
    """A streamed job's peak (`streams`): quantizing, its float parts outside the layers, one layer in float and the
    method's working set; then running, the quantized weights (`stored`, the cache's bytes where it
    holds them; else counted from the formats' bits), the float parameters they leave, the KV cache. The runtime
    beside either."""
    part, hidden, layers, per_layer, vocab, tied = _sizes(config)
    shape = SimpleNamespace(**part)
    spec = cfg.precision.spec(cfg.model)
    run_bytes = DTYPE_BYTES[cfg.precision.dtype]
    widest = max((spec.format, spec.wide_format), key=lambda n: formats.get(n).bits)
    missing = stored is None
    if missing:
        stored = int(layers * per_layer * _weight_bytes(widest, spec.group_size))
        if spec.quantize_head:
            stored += int(vocab * hidden * _weight_bytes(spec.head_format or spec.format, spec.group_size))
        stored = int(stored * CACHED_OVERHEAD)
    outside = vocab * hidden * (1 if tied or spec.quantize_head else 2)
    running = stored + outside * run_bytes + _kv_bytes(cfg, shape)
    quantizing = 0
    if missing:
        heads = vocab * hidden * (1 if tied else 2)
        quantizing = (heads + per_layer) * float_bytes + spec.calibration_bytes(shape)
    return max(running, quantizing) + RUNTIME_BYTES


def _own_model_bytes(cfg: JobConfig) -> int | None:
    """What a model folder of the user's own holds once loaded (float32, as src.models.load builds it whole), counted
    from its config.json before anything is built (streamed where `streams`: never whole, a layer at a time in the
    precision's dtype); None where there is no folder to read."""
    if cfg.model.weights == "random" or not cfg.model.local_path:
        return None
    try:
        config = hub.folder_config(cfg.model.local_path)
    except hub.NotAModel:
        return None  # the load says what is wrong with it, in its own line
    if streams(cfg) and cfg.draft_model is None:  # its float layers in the precision's dtype (src.assembly.job)
        return _streamed_bytes(cfg, config, DTYPE_BYTES[cfg.precision.dtype], None)
    return counted_parameters(config) * 4 + RUNTIME_BYTES


CACHED_OVERHEAD = 1.3  # a cached job's peak over its cache entry, with the embedding, the runtime and the KV cache
# beside (7B: 5.07 GB for a 3.95 GB entry, the heap trimmed as install and the step's fusion free their copies)


def _stored(cfg: JobConfig) -> int | None:
    """The bytes of a random-weights job's quantized cache entry, where the cache holds it."""
    spec = cfg.precision.spec(cfg.model)
    where = entry(
        byte_tokenizer(), spec, f"random:{cfg.model.name}:{SEED}", Corpus(cfg.dataset).reader("calibration"),
        cfg.precision.calib_samples, cfg.precision.calib_seq_len, cfg.cache_dir, cfg.model.name,
    )  # fmt: skip
    stored = quant_cache.stored_bytes(where.directory)
    return None if stored is None else int(stored * CACHED_OVERHEAD)


def estimate_bytes(cfg: JobConfig) -> int | None:
    own = _own_model_bytes(cfg)
    if own is not None:
        return own
    shape = _shape(cfg)
    if shape is None:
        return None
    if cfg.draft_model is None and streams(cfg):  # a draft's own estimate is the float path's below
        return _streamed_bytes(cfg, shape.to_dict(), 2, _stored(cfg))
    params = parameter_count(shape)
    built = params * 2  # bf16, as random weights are built
    # Quantizing a linear makes a float32 copy of it: the largest, Qwen1.5-7B's 152k-row head, is 2.5 GB
    # (measured: its w8a8 job peaked 1.2 GB above an estimate without this).
    largest = max(shape.vocab_size, getattr(shape, "intermediate_size", None) or shape.ffn_dim) * shape.hidden_size * 4
    held = params * DTYPE_BYTES[cfg.precision.dtype] if not cfg.precision.quantized else built + largest
    draft = 0
    if cfg.draft_model is not None and cfg.draft_model.name != cfg.model.name:
        draft = parameter_count(config_of(cfg.draft_model.name)) * 2
    elif cfg.draft_model is not None:  # a self-draft: a second, quantized copy
        draft = params
    return max(built, held) + draft + _kv_bytes(cfg, shape) + _calibration_bytes(cfg, shape) + RUNTIME_BYTES


def _calibration_bytes(cfg: JobConfig, shape) -> int:
    """A calibration forward's largest tensor, the logits of every window (float32), which at a 150k-token
    vocabulary outweigh a 0.5B model; plus what the method's own pass holds (src.quant.methods)."""
    specs = [
        (p, p.quant)
        for p in (cfg.precision, cfg.draft_precision)
        if p is not None and p.quantized and p.quant.calibrates
    ]
    if not specs:
        return 0
    logits = max(p.calib_samples * p.calib_seq_len for p, _ in specs) * shape.vocab_size * 4
    return logits + max(spec.calibration_bytes(shape) for _, spec in specs)


def release_freed() -> None:
    """Free what a sweep's previous job left: its objects (reference cycles), then the C heap's free
    pages, which glibc keeps for reuse and the OS counts as used. Measured after a Llama-2-7B w8a16 job:
    2.1 GB still resident after gc.collect(), returned by malloc_trim; across a sweep's jobs 7 GB were
    kept and the fourth job was refused with 15.3 GB "available"."""
    gc.collect()
    heap.trim()


def device_free(device: str) -> int | None:
    """Bytes free on a GPU now (what its driver says: other processes' use included), None on the CPU."""
    if device == "cpu":
        return None
    free, _total = torch.cuda.mem_get_info(torch.device(device))
    return free


def check(cfg: JobConfig, available: int | None = None, device: str = "cpu") -> int | None:
    """The estimate in bytes (None where the shape is not known beforehand); ConfigError when it exceeds
    the memory available now: the host's, or on a GPU (`device`) the device's, which holds the weights,
    the cache and the activations (the interpreter's share stays on the host)."""
    need = estimate_bytes(cfg)
    if need is None:
        return None
    where = "memory"
    if available is None and device != "cpu":
        need, available, where = need - RUNTIME_BYTES, device_free(device), f"{device} memory"
    available = psutil.virtual_memory().available if available is None else available
    if need > available:
        raise ConfigError(
            f"{cfg.model.name} at {cfg.precision.name} needs about {need / GB:.1f} GB of {where} and "
            f"{available / GB:.1f} GB is available; free memory, or pick a smaller model or precision"
        )
    return need
