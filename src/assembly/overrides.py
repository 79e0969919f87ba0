"""The command line, checked before Hydra composes it: unknown choices and unknown fields get one line
(Hydra's own messages run to five lines and end in a hint about HYDRA_FULL_ERROR)."""

from __future__ import annotations

import re
from pathlib import Path

from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.errors import HydraException, OverrideParseException
from omegaconf import DictConfig, OmegaConf

from src.assembly.config import GROUPS, ConfigError, unread
from src.common.environment import PROJECT_ROOT

CONF_DIR = PROJECT_ROOT / "conf"
LAUNCHERS = ("basic", "ray")  # Hydra's own, and quantspec's (hydra_plugins/quantspec_ray)


def config_dirs(args: list[str]) -> list[Path]:
    """conf/, then the folders `hydra.searchpath=[file://...]` adds (a user's own entries, e.g. a runtime's
    conf/engine/<name>.yaml kept outside the repository), in Hydra's order: conf/ first."""
    dirs = [CONF_DIR]
    for arg in args:
        match = re.fullmatch(r"\+{0,2}hydra\.searchpath=\[(.*)\]", arg)
        if match:
            dirs += [
                Path(item.strip().strip("'\"")[len("file://") :])
                for item in match.group(1).split(",")
                if item.strip().strip("'\"").startswith("file://")
            ]
    return dirs


def _known(group: str, dirs: list[Path]) -> list[str]:
    return sorted({p.stem for d in dirs for p in (d / group).glob("*.yaml") if not p.stem.startswith("_")})


def _entry_file(group: str, name: str, dirs: list[Path]) -> Path | None:
    return next((d / group / f"{name}.yaml" for d in dirs if (d / group / f"{name}.yaml").is_file()), None)


def unparsable(args: list[str]) -> str | None:
    """The first override Hydra's grammar cannot read, in one line (Hydra's own error is a multi-line
    report with a link), or None."""
    parser = OverridesParser.create()
    for arg in args:
        if arg.startswith("-") or "=" not in arg:
            continue
        try:
            parser.parse_override(arg)
        except (OverrideParseException, HydraException) as err:
            shown = arg if len(arg) <= 60 else arg[:57] + "..."
            why = str(err).strip().splitlines()[0][:80]
            return (
                f"cannot read the override {shown!r} ({why}); quote values that hold spaces, non-ASCII or "
                f"special characters, e.g. key='a value'"
            )
    return None


def unknown_choice(args: list[str]) -> str | None:
    """One line naming an unknown group choice on the command line, or None.

    Hydra's own message for this is a dozen lines with a search path; users need the name and the options.
    """
    dirs = config_dirs(args)
    for arg in args:
        launcher = re.fullmatch(r"hydra/launcher=(.*)", arg)
        if launcher and launcher.group(1) not in LAUNCHERS:
            return f"unknown hydra/launcher {launcher.group(1)!r}; choose from: {', '.join(LAUNCHERS)}"
        match = re.fullmatch(r"\+?(\w+)(?:@[\w.]+)?=([^()\[\]{}]*)", arg)  # also precision@draft.precision=
        if not match or match.group(1) not in GROUPS:
            continue
        group, values = match.groups()
        known = _known(group, dirs)
        for value in (v.strip() for v in values.split(",")):
            if value not in known:
                return f"unknown {group} {value!r}; choose from: {', '.join(known)} (or add conf/{group}/{value}.yaml)"
    return None


def unknown_key(args: list[str]) -> str | None:
    """One line naming an override of a group's field that the chosen entry does not have, or None.

    Hydra's own message is five lines ending in a hint about HYDRA_FULL_ERROR."""
    chosen = {
        g: [v.strip() for v in m.group(2).split(",")]
        for a in args
        if (m := re.fullmatch(r"(\w+)=([^()\[\]{}]*)", a)) and (g := m.group(1)) in GROUPS
    }
    dirs = config_dirs(args)
    defaults = OmegaConf.load(CONF_DIR / "config.yaml").defaults
    for entry in defaults:
        if isinstance(entry, DictConfig):
            for group, value in entry.items():
                chosen.setdefault(str(group), [str(value)])
    for arg in args:
        match = re.fullmatch(r"(\w+)\.([\w.]+)=.*", arg)
        if not match or match.group(1) not in GROUPS:
            continue
        group, path = match.groups()
        unread_by = {}  # chosen entries whose kind does not read this field (another kind's, from _fields)
        for value in chosen.get(group, []):
            try:
                node = entry = group_entry(group, value, group, dirs)
            except ConfigError:
                continue  # an unknown choice is unknown_choice's to report
            for part in path.split("."):
                if not isinstance(node, dict) or part not in node:
                    return (
                        f"{group}.{path} is not a setting of {group} {value}; its settings: "
                        f"{', '.join(sorted(node)) if isinstance(node, dict) else '(none below ' + part + ')'}"
                    )
                node = node[part]
            owner = unread(group, entry, path)
            if owner is not None:
                unread_by[value] = owner
        if unread_by and len(unread_by) == len(chosen.get(group, [])):  # in a sweep, one job reading it is enough
            return (
                f"{group}.{path} is read by {next(iter(unread_by.values()))}, not by {group} "
                f"{', '.join(unread_by)}; pick one that reads it, or leave it out"
            )
    return None


def group_entry(group: str, name: str, where: str, dirs: list[Path] | None = None) -> dict:
    """conf/<group>/<name>.yaml as Hydra composes it, as a plain dict: over the files its defaults list
    names (e.g. _fields), with other groups' entries nested where it places them (a draft's
    `/precision@precision: w8a8` becomes its `precision` field)."""

    dirs = dirs or [CONF_DIR]
    path = _entry_file(group, name, dirs)
    if path is None:
        raise ConfigError(f"{where}={name!r} is not in conf/{group}/; choose from: {', '.join(_known(group, dirs))}")
    node = OmegaConf.load(path)
    parts = []
    for entry in node.pop("defaults", None) or []:
        if isinstance(entry, str) and entry != "_self_":
            parts.append(OmegaConf.load(_entry_file(group, entry, dirs) or path.with_name(f"{entry}.yaml")))
        elif isinstance(entry, DictConfig):
            for key, value in entry.items():  # /other_group@field: choice
                other, _, field = str(key).lstrip("/").partition("@")
                parts.append(OmegaConf.create({field or other: group_entry(other, str(value), where, dirs)}))
    return OmegaConf.to_container(OmegaConf.merge(*parts, node), resolve=True)
