"""The command line, checked before any job runs: composed as Hydra composes each job (the groups' schemas,
src.assembly.schema, type every field), and whatever composition refuses said in one line (Hydra's own
messages run to five lines and end in a hint about HYDRA_FULL_ERROR).

A sweep is checked value by value: every override at its first value, then each other value of each sweep
in turn, so a bad value anywhere in it is found before the first job. Beyond the schemas, a field that no
chosen entry's kind reads (task.window on a decode task) is refused too: it would change nothing.
"""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

from hydra import compose, initialize_config_dir
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.core.override_parser.types import IntervalSweep, Override, OverrideType
from hydra.errors import ConfigCompositionException, HydraException, MissingConfigException, OverrideParseException
from omegaconf import DictConfig, ListConfig, OmegaConf

from src.assembly import schema  # registers the groups' schemas, which composition types every field by
from src.assembly.config import AXIS_KINDS, reads_dataset, unread
from src.common import renames, signals
from src.common.environment import PROJECT_ROOT
from src.common.say import message_line

CONF_DIR = PROJECT_ROOT / "conf"
# Hydra's own flags (src.run is Hydra's app): those that take a value, by either name
VALUED = {
    "--config-path": "path",
    "-cp": "path",
    "--config-name": "name",
    "-cn": "name",
    "--config-dir": "dir",
    "-cd": "dir",
    "--cfg": "",
    "-c": "",
    "--package": "",
    "-p": "",
    "--info": "",
    "-i": "",
}
TYPE_WORDS = {int: "an integer", float: "a number", str: "a string", bool: "true or false"}
PLURAL = {int: "integers", float: "numbers", str: "strings", bool: "true or false values"}


# Hydra's flags that take the next word as their value (`-cn config`, `--cfg job`): that word is no override.
VALUED_FLAGS = {"-cn", "--config-name", "-cp", "--config-path", "-cd", "--config-dir", "-c", "--cfg", "-p", "--package"}


def unparsable(args: list[str]) -> str | None:
    """The first override Hydra's grammar cannot read, in one line (Hydra's own error is a multi-line
    report with a link, and a word without `=` a traceback), or None."""
    parser = OverridesParser.create()
    given: dict[str, str] = {}  # each key's override as given: a key given twice is one line, not the last kept
    for i, arg in enumerate(args):
        if arg.startswith("-") or (i and args[i - 1] in VALUED_FLAGS):
            continue
        key = arg.partition("=")[0].lstrip("+~")
        if key in given:
            return (
                f"{key} is given twice ({given[key]} and {arg}); give it once (a sweep over both is {key}=a,b with -m)"
            )
        given[key] = arg
        if "=" not in arg and not arg.startswith("~"):  # ~key deletes: Hydra's grammar reads it
            shown = arg if len(arg) <= 60 else arg[:57] + "..."
            return f"{shown!r} is not an override: overrides are key=value (e.g. model=llama-160m, precision=w8a8)"
        try:
            parser.parse_override(arg)
        except (OverrideParseException, HydraException) as err:
            shown = arg if len(arg) <= 60 else arg[:57] + "..."
            why = message_line(err)[:80]
            return (
                f"cannot read the override {shown!r} ({why}); quote values that hold spaces, non-ASCII or "
                f"special characters, e.g. key='a value'"
            )
    return None


def _written(o: Override, value: str) -> str:
    prefix = {OverrideType.ADD: "+", OverrideType.FORCE_ADD: "++", OverrideType.DEL: "~"}.get(o.type, "")
    return f"{prefix}{o.key_or_group}={value}"


def split(args: list[str]) -> tuple[list[str], dict[str, str]]:
    """The command line's overrides, and Hydra's flags that choose the config (path, name, dir) by kind."""
    overrides, chosen, skip = [], {}, False
    for i, arg in enumerate(args):
        if skip:
            skip = False
            continue
        name, eq, value = arg.partition("=")
        if name in VALUED:
            if not eq and i + 1 < len(args) and not (name in ("--info", "-i") and "=" in args[i + 1]):
                value, skip = args[i + 1], True
            if VALUED[name]:
                chosen[VALUED[name]] = value
        elif not arg.startswith("-"):
            overrides.append(arg)
    return overrides, chosen


def variants(overrides: list[str]) -> list[list[str]]:
    """The jobs to compose to check a command line: every override at its first value, then each other
    value of each sweep in turn. An interval, which only a search samples, is left out."""
    parsed = OverridesParser.create().parse_overrides(overrides)
    each = []  # per override: the values to try (one where it is no sweep)
    for o in parsed:
        if not o.is_sweep_override():
            each.append([o.input_line])
        elif not isinstance(o.value(), IntervalSweep):
            each.append([_written(o, v) for v in o.sweep_string_iterator()])
    first = [values[0] for values in each]
    jobs = [first]
    for i, values in enumerate(each):
        jobs += [[*first[:i], value, *first[i + 1 :]] for value in values[1:]]
    return jobs


def composition_problem(args: list[str]) -> str | None:
    """One line saying why the command line's jobs cannot be composed (an unknown choice, a key a group
    does not have, a value of the wrong type, a field no chosen entry reads), or None. A config folder of
    the user's own (--config-path, --config-name) is composed as Hydra will; one added to the search path
    (--config-dir) is left to Hydra."""
    overrides, chosen = split(args)
    old = _old_spelling(overrides)
    if old or "dir" in chosen:
        return old
    where = (CONF_DIR, "config", chosen)
    composed = []
    for job in variants(overrides):
        try:
            cfg = _compose(job, where)
        except MissingConfigException as err:
            return _unknown_choice(err)
        except ConfigCompositionException as err:
            signals.check()  # a stop that landed inside the composition comes back wrapped as its error
            return _refused(err, job, where)
        composed.append(cfg)
    return next(filter(None, map(_untyped, composed)), None) or _unread(overrides, composed)


def _old_spelling(overrides: list[str]) -> str | None:
    """An override under a name or value renamed since (precision.scheme, engine.step_path=quantspec), refused
    in one line naming the new one (src.common.renames), or None."""
    for o in OverridesParser.create().parse_overrides(overrides):
        if o.is_sweep_override() and not isinstance(o.value(), IntervalSweep):
            values = list(o.sweep_string_iterator())
        else:
            values = [o.get_value_element_as_str()] if not o.is_sweep_override() and not o.is_delete() else [None]
        for value in values:
            refused = renames.refusal(o.key_or_group, value)
            if refused:
                return refused
    return None


def _compose(job: list[str], where) -> DictConfig:
    default_dir, default_name, chosen = where
    folder = Path(chosen.get("path", default_dir)).resolve()
    with initialize_config_dir(config_dir=str(folder), version_base="1.3"):
        return compose(chosen.get("name", default_name), overrides=job, return_hydra_config=True)


def _untyped(cfg: DictConfig) -> str | None:
    """A chosen entry that does not start from its group's schema (a user's own file without
    `defaults: [_schema, _self_]`, or [_fields, _self_]): its values would go unchecked, so it is refused."""
    for group in schema.SOURCES:
        node = cfg.get(group)
        if isinstance(node, DictConfig) and OmegaConf.get_type(node) is dict:
            choice = cfg.hydra.runtime.choices.get(group, "?")
            start = "_fields" if (CONF_DIR / group / "_fields.yaml").is_file() else "_schema"
            return (
                f"{group} {choice} does not start from the {group} schema, so its values would go unchecked; begin "
                f"its YAML with `defaults: [{start}, _self_]` "
                f"(docs/concepts/axes.md)"
            )
    return None


def _unknown_choice(err: MissingConfigException) -> str:
    """Hydra's `Could not find 'precision/w3a3'` and its list of options, in one line."""
    text = str(err)
    wanted = text.split("Could not find '", 1)[-1].split("'", 1)[0]
    group, _, name = wanted.rpartition("/")
    options = text.split("Available options in", 1)[-1].split("Config search path", 1)[0].splitlines()[1:]
    known = sorted(o.strip() for o in options if o.strip() and not o.strip().startswith("_"))
    where = f" (or add conf/{group}/{name}.yaml)" if not group.startswith("hydra") else ""
    return f"unknown {group} {name!r}; choose from: {', '.join(known)}{where}"


def _refused(err: ConfigCompositionException, job: list[str], where) -> str:
    """A key the group does not have, or a value its field's type refuses, in one line."""
    cause = err.__cause__
    said = str(err)
    found = re.search(r"full_key: (\S+)", f"{said}\n{cause}")
    key = getattr(cause, "full_key", None) or (found.group(1) if found else said.split("'")[1] if "'" in said else "")
    key = key.split("[", 1)[0]  # an item of a list: the list's own override names it
    line = next((a for a in reversed(job) if a.lstrip("+~").split("=", 1)[0] == key), None)  # the last one set
    base = _base(job, line, where)
    if "not in" in str(cause) or "Could not override" in said or "' not in '" in said:  # the last: an entry's YAML
        return _not_a_setting(key, base)
    node = _node(base, key)
    if line is None:  # a value in an entry's YAML, not on the command line: Hydra's words, in one line
        why = next((w for w in f"{said}\n{cause}".splitlines() if w.startswith(("Value", "Incompatible"))), said)
        return f"{key}: {why.strip()} (in the {key.split('.')[0]} entry's YAML)"
    value = OverridesParser.create().parse_override(line).value()
    if node is None:
        return f"{key}={value!r}: {message_line(cause or err)}"
    kind = node._metadata.ref_type
    words = TYPE_WORDS.get(kind, f"a {getattr(kind, '__name__', kind)}".lower())
    if isinstance(node, ListConfig):
        words = f"a list of {PLURAL.get(node._metadata.element_type, 'values')}"
    return f"{key}={value!r} must be {words}" + (" (or null)" if node._metadata.optional else "")


def _node(cfg: DictConfig | None, key: str):
    """The node at a dotted key (its metadata says its type), or None."""
    node = cfg
    for part in key.split("."):
        if not isinstance(node, DictConfig) or part not in node:
            return None
        node = node._get_node(part)
    return node


def _base(job: list[str], without: str | None, where) -> DictConfig | None:
    """The job composed without the refused override (to name what the group has), or None."""
    try:
        return _compose([a for a in job if a != without], where)
    except HydraException:
        return None


def _not_a_setting(key: str, base: DictConfig | None) -> str:
    renamed = renames.refusal(key)  # an entry's YAML of one's own, written before the rename
    if renamed:
        return f"{renamed} (in the {key.split('.')[0]} entry's YAML)"
    group, _, path = key.partition(".")
    choice = base.hydra.runtime.choices.get(group, "") if base is not None else ""
    node, parts = (base.get(group) if base is not None else None), path.split(".")
    for part in parts[:-1]:
        if not isinstance(node, DictConfig) or part not in node:
            break
        node = node[part]
    if isinstance(node, DictConfig):
        names = set(node)
        # every task composes every task's fields (conf/task/_fields.yaml): name only the ones its kind reads
        kinds = AXIS_KINDS.get(group) if len(parts) == 1 else None
        kind = kinds.get(node.get(kinds.selector)) if kinds is not None else None
        if kind is not None:
            names &= {f.name for f in dataclasses.fields(kind)} | {kinds.selector}
        settings = ", ".join(sorted(names))
    else:
        settings = f"(none below {parts[0]})"
    return f"{key} is not a setting of {group} {choice}; its settings: {settings}"


def _reads_dataset(cfg: DictConfig) -> bool:
    parts = ("task", "precision", "draft", "engine", "dataset")
    return reads_dataset({k: OmegaConf.to_container(cfg[k], resolve=False) for k in parts if k in cfg})


def _unread(args: list[str], composed: list[DictConfig]) -> str | None:
    """A field override that no composed job's entry reads (another kind's field), or a dataset that no job
    reads, or None: in a sweep, one job reading it is enough."""
    for arg in args:
        key = arg.split("=", 1)[0].lstrip("+~")
        if key.split(".", 1)[0] == "dataset" and not any(_reads_dataset(cfg) for cfg in composed):
            tasks = sorted({cfg.hydra.runtime.choices.get("task", "?") for cfg in composed})
            return (
                f"{key}=... is read by no job here: task {', '.join(tasks)} reads no dataset (task benchmark, "
                f"benchmark_long and perplexity do, decode a prompts file (dataset=jsonl), and a calibrating "
                f"precision such as w8a8 or w4a16); leave it out"
            )
        group, _, path = key.partition(".")
        if "=" not in arg or not path or group not in composed[0] or not isinstance(composed[0][group], DictConfig):
            continue
        owners = {}
        for cfg in composed:
            owner = unread(group, OmegaConf.to_container(cfg[group], resolve=False), path)
            if owner is None:
                break
            owners[cfg.hydra.runtime.choices.get(group, "")] = owner
        else:
            return (
                f"{key} is read by {next(iter(owners.values()))}, not by {group} {', '.join(owners)}; pick one "
                f"that reads it, or leave it out"
            )
    return None
