"""A model of the user's own, named by a hub id (model=hub model.id=org/name), a folder (model.local_path) or a
GGUF file (model=gguf model.gguf=path): its name, and the family quantspec serves it as, read from the model's
own config before the job is built.

A hub id is read through the Hugging Face cache (huggingface_hub's, where HF_HOME or HF_HUB_CACHE point), so a
model downloaded once runs offline (HF_HUB_OFFLINE=1). The family is the config's `model_type` (a GGUF's
`general.architecture`): one quantspec's engine and quantizers map (src.models.families) runs on its kernels; any other
causal LM transformers knows is `other`, which only transformers' generate runs (engine=hf).
"""

from __future__ import annotations

import json
import re
from pathlib import Path

from gguf import GGUFReader
from huggingface_hub import constants, hf_hub_download
from huggingface_hub.errors import HfHubHTTPError
from transformers.modeling_gguf_pytorch_utils import GGUF_SUPPORTED_ARCHITECTURES
from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

from src.common.say import message_line
from src.models import families
from src.models.config import MODEL_NAME, OTHER

# a hub id as the hub writes one: an optional owner, a name; letters, digits and . _ -
HUB_ID = re.compile(r"(?:[A-Za-z0-9][A-Za-z0-9._-]*/)?[A-Za-z0-9][A-Za-z0-9._-]*")


class NotAModel(ValueError):
    """The named model cannot be read as one here; the message says what to do, in one line."""


def name_of(model_id: str | None = None, path: str | None = None) -> str:
    """A model's name (its cache folder, its tag) from its hub id (org/name -> org--name), else from its folder's
    or GGUF file's name; "" where neither is given (model=hub's validation says what to give)."""
    if model_id:
        stem = str(model_id).replace("/", "--")
    elif path:
        stem = Path(str(path)).expanduser().name.removesuffix(".gguf")
    else:
        return ""
    name = re.sub(r"[^A-Za-z0-9._-]", "_", stem).lstrip("._-")
    return name if MODEL_NAME.fullmatch(name or "-") else "model"


def hub_config(model_id: str) -> dict:
    """The config.json of hub model `model_id`, through the Hugging Face cache (downloaded where the hub is
    reachable and the cache lacks it)."""
    if not HUB_ID.fullmatch(model_id):
        raise NotAModel(f"model.id={model_id!r} is not a hub id (org/name: letters, digits and . _ -)")
    try:
        path = hf_hub_download(model_id, "config.json")
    except (OSError, ValueError, HfHubHTTPError) as err:
        where = constants.HF_HUB_CACHE
        offline = " (HF_HUB_OFFLINE is set)" if constants.HF_HUB_OFFLINE else " and the hub is unreachable"
        raise NotAModel(
            f"model.id={model_id}: its config.json is not in the Hugging Face cache ({where}){offline} "
            f"({type(err).__name__}); download it where the hub is reachable (`hf download {model_id}`), or give "
            f"its folder as model.local_path=/path/to/it"
        ) from None
    return _json(Path(path), f"model.id={model_id}")


def folder_config(folder: str) -> dict:
    """The config.json of a model folder."""
    path = Path(folder).expanduser() / "config.json"
    if not path.is_file():
        raise NotAModel(
            f"model.local_path={folder} has no config.json; it must be a Hugging Face model folder "
            f"(config.json, weights, tokenizer files)"
        )
    return _json(path, f"model.local_path={folder}")


# the files of a model folder that can name Python of the folder's own for transformers to import and run
CODE_FILES = ("config.json", "tokenizer_config.json", "processor_config.json", "preprocessor_config.json")


def refuse_code(folder: Path, what: str) -> None:
    """NotAModel (one line naming the file) where one of a model's files asks transformers to run the model's own
    Python (an `auto_map`): quantspec runs no model's code. Every load also passes trust_remote_code=False, which
    makes transformers refuse such a model outright instead of asking on stdin."""
    for name in CODE_FILES:
        path = folder / name
        if not path.is_file():
            continue
        config = _json(path, what)
        if config.get("auto_map") or config.get("trust_remote_code"):
            raise NotAModel(
                f"{what}: {path} asks to run the model's own code (auto_map), which quantspec never runs; use a "
                f"model whose architecture transformers builds itself, or remove auto_map from {name}"
            )


def hub_file(model_id: str, name: str) -> Path | None:
    """A file of hub model `model_id` in the Hugging Face cache (downloaded where the hub is reachable), or None
    where the model has none."""
    try:
        return Path(hf_hub_download(model_id, name))
    except (OSError, ValueError, HfHubHTTPError):
        return None


def refuse_hub_code(model_id: str) -> None:
    """refuse_code for a hub id: its files as the Hugging Face cache holds them."""
    for name in CODE_FILES:
        path = hub_file(model_id, name)
        if path is not None:
            refuse_code(path.parent, f"model.id={model_id}")
            return  # a snapshot folder holds them all


def _json(path: Path, what: str) -> dict:
    try:
        config = json.loads(path.read_text())
    except (ValueError, OSError) as err:
        raise NotAModel(f"{what}: {path} cannot be read as JSON ({message_line(err)[:120]})") from None
    if not isinstance(config, dict):
        raise NotAModel(f"{what}: {path} holds {type(config).__name__}, not a model's config (a JSON object)")
    return config


def family(model_type: object, what: str) -> str:
    """quantspec's family for a config's model_type: one it maps, else `other` where transformers builds it as
    a causal LM; refused (one line) where it does not."""
    found = families.for_model_type(model_type) if isinstance(model_type, str) else None
    if found is not None:
        return found.name
    if isinstance(model_type, str) and model_type in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES:
        return OTHER
    raise NotAModel(
        f"{what} has model_type {model_type!r}, which transformers does not build as a causal language model; "
        f"quantspec decodes causal LMs only"
    )


def gguf_architecture(path: str) -> tuple[str, str]:
    """A GGUF file's family, and its metadata's general.architecture."""
    file = Path(path).expanduser()
    if not file.is_file():
        raise NotAModel(f"model.gguf={path} is not a file; give the path of a .gguf file")
    try:
        field = GGUFReader(str(file)).fields.get("general.architecture")
        arch = bytes(field.parts[field.data[0]]).decode() if field is not None else None
    except (ValueError, OSError, IndexError, UnicodeDecodeError) as err:
        raise NotAModel(f"model.gguf={path} cannot be read as GGUF ({message_line(err)[:120]})") from None
    found = families.for_gguf(arch) if isinstance(arch, str) else None
    if found is not None:
        return found.name, arch
    if arch in GGUF_SUPPORTED_ARCHITECTURES and arch not in ("general", "tokenizer", "t5", "umt5"):
        return OTHER, arch
    raise NotAModel(
        f"model.gguf={path} holds a {arch!r} model, which transformers cannot read from GGUF as a causal LM; "
        f"convert it to a model folder and give model.local_path="
    )
