"""Hydra's structured configs for quantspec's groups: a dataclass per config group, registered in Hydra's
ConfigStore as `<group>/_schema`, so that composition itself refuses a value of the wrong type or a key the
group does not have (`task.limit=abc`, `task.limt=2`), before any job is built.

Each schema is made from the config classes that read the group (src.assembly.config's, and every kind of
an axis with kinds: a task's fields are every task kind's), so a field added to a class is in the schema on
the next run. The types are the classes' own, as OmegaConf takes them (a tuple is a list; an optional is
Optional). The defaults and their words stay in the YAML users edit: conf/<group>/_fields.yaml (where a group
has kinds, every kind's fields with their defaults) starts from the schema, and every entry from _fields.
What a value may be beyond its type (a choice among names, a range) is the classes' validate().
"""

from __future__ import annotations

import dataclasses
import types
import typing
from pathlib import Path
from typing import Any, Optional

from hydra.core.config_store import ConfigStore
from omegaconf import MISSING, OmegaConf

from src.assembly import config as C
from src.common.axes import GROUPS
from src.models.hub import name_of
from src.quant.methods import METHODS
from src.tasks.kinds import TASKS

NAME = "_schema"
# group -> the classes whose fields it holds (every kind's, for an axis with kinds), and what else it holds
SOURCES: dict[str, tuple[list[type], dict[str, Any]]] = {
    "model": ([C.ModelConfig], {}),
    "hardware": ([C.HardwareConfig], {}),
    # a draft's model and precision are other groups' entries composed into it (draft.model, draft.precision)
    "draft": ([C.DraftConfig], {"model": Any, "precision": Any}),
    "precision": ([C.PrecisionConfig, *(cls for _, cls in METHODS.items())], {"method": str}),
    "task": ([cls for _, cls in TASKS.items()], {"kind": str}),
    "engine": ([C.RuntimeEngine, *(cls for _, cls in C.ENGINES.items())], {"kind": str, "module": Optional[str]}),  # noqa: UP045
    "dataset": ([C.DatasetConfig], {}),
    "tracking": ([cls for _, cls in C.TRACKING.items()], {"kind": str}),
}
INTERNAL = {"precision": {"quant"}}  # built from other fields, never set by a user


def omega_type(hint: Any) -> Any:
    """A config class's annotation as OmegaConf types a node: tuples become lists, X | None Optional[X],
    and what it does not type (a union of two kinds, a path) Any."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin in (typing.Union, types.UnionType):
        inner = [a for a in args if a is not type(None)]
        kind = omega_type(inner[0]) if len(inner) == 1 else Any
        return Optional[kind] if type(None) in args and kind is not Any else kind  # noqa: UP045 - OmegaConf's
    if origin in (tuple, list):
        return list[omega_type(args[0])] if args and args[0] is not Ellipsis else list[Any]
    if origin is dict:
        return dict[str, Any]
    if hint in (int, float, str, bool):
        return hint
    if hint is Path:
        return str
    return Any


def _field(cls_field: dataclasses.Field, hint: Any) -> tuple[str, Any, dataclasses.Field]:
    kind = omega_type(hint)
    if cls_field.default is not dataclasses.MISSING and not isinstance(cls_field.default, (tuple, list, dict)):
        return cls_field.name, kind, dataclasses.field(default=cls_field.default)
    if cls_field.default is not dataclasses.MISSING or cls_field.default_factory is not dataclasses.MISSING:
        made = cls_field.default if cls_field.default is not dataclasses.MISSING else cls_field.default_factory()
        value = list(made) if isinstance(made, tuple) else made
        return cls_field.name, kind, dataclasses.field(default_factory=lambda v=value: v)
    return cls_field.name, kind, dataclasses.field(default=MISSING)  # mandatory: the entry sets it


def schema(group: str) -> type:
    """The group's schema dataclass: every field its classes have (the first class's type and default where
    two share one), and the keys it holds besides."""
    classes, extra = SOURCES[group]
    fields: dict[str, tuple] = {}
    every = set.intersection(*({f.name for f in dataclasses.fields(c)} for c in classes))
    for cls in classes:
        hints = typing.get_type_hints(cls)
        for f in dataclasses.fields(cls):
            if f.name not in fields and f.name not in INTERNAL.get(group, ()):
                # a field only some kinds have is null for the others (their entries set it so)
                hint = hints[f.name] if f.name in every else Optional[hints[f.name]]  # noqa: UP045
                fields[f.name] = _field(f, hint)
    for key, kind in extra.items():
        unset = None if kind is Any or type(None) in typing.get_args(kind) else MISSING
        fields.setdefault(key, (key, kind, dataclasses.field(default=unset)))
    return dataclasses.make_dataclass(f"{group.capitalize()}Schema", list(fields.values()))


def _sampling() -> type:
    hints = typing.get_type_hints(C.Sampling)
    return dataclasses.make_dataclass(
        "SamplingSchema", [_field(f, hints[f.name]) for f in dataclasses.fields(C.Sampling)]
    )


def root() -> type:
    """The composition's own keys (conf/config.yaml's): the sweep's settings and sampling; the groups are
    typed by their own schemas."""
    sampling = _sampling()
    return dataclasses.make_dataclass(
        "ConfigSchema",
        [
            *((group, Any, dataclasses.field(default=MISSING)) for group in GROUPS),
            ("sampling", sampling, dataclasses.field(default_factory=sampling)),
            ("cache_dir", str, dataclasses.field(default=MISSING)),
            ("experiment", str, dataclasses.field(default="quantspec")),
            ("resume", bool, dataclasses.field(default=True)),
            ("report_at_end", bool, dataclasses.field(default=True)),
            ("rounds", int, dataclasses.field(default=1)),
            ("busy_reruns", int, dataclasses.field(default=0)),
            ("round", int, dataclasses.field(default=1)),
        ],
    )


def register() -> None:
    """Every group's schema, and the composition's, in Hydra's ConfigStore (a store entry is replaced)."""
    store = ConfigStore.instance()
    for group in SOURCES:
        store.store(group=group, name=NAME, node=schema(group))
    store.store(name=NAME, node=root())
    # a model of one's own is named after its hub id, folder or file (conf/model/hub.yaml, gguf.yaml)
    OmegaConf.register_new_resolver("quantspec_model_name", name_of, replace=True)


register()
