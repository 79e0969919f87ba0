"""A model of the user's own (model=hub model.id=org/name, model=hub model.local_path=<folder>, model=gguf
model.gguf=<file>): its family read from its own config before the job's config is built, and the engine that
runs it. The composed job (its plain dict) is rewritten here, once, so that its params, its name and its config
all say what ran.

A family quantspec's engine maps (src.models.families) runs as asked, on quantspec's kernels by default;
any other causal LM is model.arch=other, which only transformers' generate runs: a job on quantspec's engine is
moved to engine=hf (conf/engine/hf.yaml's settings over the job's engine fields), and says so (the job's
engine_note tag, src.assembly.job).
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from omegaconf import OmegaConf

from src.assembly.overrides import CONF_DIR
from src.common.schema import ConfigError
from src.models import hub
from src.models.config import AUTO, OTHER, source_problem

# the entries of conf/model/ that name a model of the user's own: a job's `model` tag is then the model's name
OWN_ENTRIES = ("hub", "gguf")


def resolve(raw: Mapping[str, Any], choices: Mapping[str, str]) -> tuple[dict, dict]:
    """The composed job and its choices, with every model.arch=auto read from its model (a draft model's too)
    and, for a model of another family on quantspec's engine, the engine hf's; ConfigError (one line) where the
    model cannot be read as one."""
    raw, choices = dict(raw), dict(choices)
    raw["model"] = _model(raw["model"])
    draft = raw.get("draft")
    if isinstance(draft, Mapping) and isinstance(draft.get("model"), Mapping):
        raw["draft"] = {**draft, "model": _model(draft["model"])}
    engine = raw.get("engine") or {}
    if raw["model"].get("arch") == OTHER and engine.get("kind") == "native" and engine.get("module") is None:
        raw["engine"] = {**engine, **_entry("engine", "hf")}
        choices["engine"] = "hf"
    if choices.get("model") in OWN_ENTRIES:
        choices["model"] = raw["model"]["name"]
    return raw, choices


def _model(section: Mapping[str, Any]) -> dict:
    section = dict(section)
    if section.get("arch") != AUTO:
        return section
    folder, model_id = section.get("local_path"), section.get("id")
    if (line := source_problem(section.get("source"), section.get("gguf"), model_id, folder)) is not None:
        raise ConfigError(line)
    try:
        if section.get("source") == "gguf_file":
            arch, model_type = hub.gguf_architecture(section["gguf"])
        else:
            config = hub.folder_config(folder) if folder else hub.hub_config(model_id)
            if folder:
                hub.refuse_code(Path(folder).expanduser(), f"model.local_path={folder}")
            else:
                hub.refuse_hub_code(model_id)
            model_type = config.get("model_type")
            arch = hub.family(model_type, f"model.local_path={folder}" if folder else f"model.id={model_id}")
    except hub.NotAModel as err:
        raise ConfigError(str(err)) from None
    return {**section, "arch": arch, "model_type": model_type}


def _entry(group: str, name: str) -> dict:
    """A config group's entry as its YAML sets it (its own keys, not its defaults list)."""
    entry = OmegaConf.to_container(OmegaConf.load(Path(CONF_DIR) / group / f"{name}.yaml"), resolve=False)
    return {k: v for k, v in entry.items() if k != "defaults"}
