"""The configuration reference, generated: every config group's choices (conf/<group>/*.yaml) and every field
with its type (the config classes of src.assembly.config, src.tasks.kinds, src.quant.methods), its default and
its meaning (conf/<group>/_fields.yaml's comment, else the class's), the values it accepts where they are a fixed set
(the code's own check_choice calls), and which kinds read it (the registries).

Nothing here is written by hand: a field added to a class and its _fields.yaml appears on the next build.
"""

from __future__ import annotations

import ast
import dataclasses
import importlib
import inspect
import re
from functools import cache
from pathlib import Path

import yaml

from src.assembly import config as C
from src.assembly import schema
from src.assembly.overrides import CONF_DIR
from src.quant.methods import METHODS
from src.tasks.kinds import TASKS

# group -> (the classes that read its fields, the registry that picks one, if any)
GROUPS = {
    "model": ([C.ModelConfig], None),
    "hardware": ([C.HardwareConfig], None),
    "precision": ([C.PrecisionConfig], METHODS),
    "draft": ([C.DraftConfig], None),
    "task": ([], TASKS),
    "engine": ([C.RuntimeEngine], C.ENGINES),
    "dataset": ([C.DatasetConfig], None),
    "tracking": ([], C.TRACKING),
}
# Who reads a field that no registered kind has: the group's own class
BASE_READER = {"precision": "every precision", "engine": "another runtime (engine.module)"}
# Built from other fields, never set by a user: precision.quant is the method's fields gathered
INTERNAL = {f"{group}.{name}" for group, names in schema.INTERNAL.items() for name in names}
KEY = re.compile(r"^(\s*)([A-Za-z_][\w]*):(.*)$")


def yaml_comments(path: Path) -> dict[str, str]:
    """Each key's comment in a YAML file, dotted by nesting: its line's `# ...`, else the comment block right
    above it (but the file's opening block, which is about the file)."""
    comments: dict[str, str] = {}
    above: list[str] = []
    stack: list[tuple[int, str]] = []
    header = True
    for line in path.read_text().splitlines():
        stripped = line.strip()
        if stripped.startswith("#"):
            if not header:
                above.append(stripped.lstrip("# ").rstrip())
            continue
        header = False
        match = KEY.match(line)
        if not match or stripped.startswith("-"):
            above = []
            continue
        indent, key, rest = len(match.group(1)), match.group(2), match.group(3)
        while stack and stack[-1][0] >= indent:
            stack.pop()
        dotted = ".".join([k for _, k in stack] + [key])
        stack.append((indent, key))
        inline = rest.split(" #", 1)[1].strip() if " #" in rest else ""
        comments[dotted] = inline or " ".join(above)
        above = []
    return comments


def class_comments(cls: type) -> dict[str, str]:
    """A dataclass's fields' trailing comments, from its source (and its bases')."""
    found: dict[str, str] = {}
    for klass in reversed(cls.__mro__):
        try:
            source = inspect.getsource(klass)
        except (OSError, TypeError):
            continue
        for line in source.splitlines():
            match = re.match(r"^\s{4}(\w+):\s*[^#]*#\s*(.*)$", line)
            if match and not match.group(1).isupper():
                found[match.group(1)] = match.group(2).strip()
    return found


def _cell(text) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


def _default(value) -> str:
    if value is None:
        return "`null`"
    if value == "???":
        return "(set by each choice)"
    return f"`{yaml.safe_dump(value, default_flow_style=True).strip().removesuffix('...').strip()}`"


def _choices(group: str) -> list[str]:
    rows = ["| choice | what it is |", "|---|---|"]
    for path in sorted((CONF_DIR / group).glob("*.yaml")):
        if path.name.startswith("_"):
            continue
        lines = [line.lstrip("# ").rstrip() for line in path.read_text().splitlines()]
        raw = path.read_text().splitlines()
        head = []
        for line, text in zip(raw, lines):
            if not line.startswith("#"):
                break
            head.append(text)
        data = yaml.safe_load(path.read_text()) or {}
        about = " ".join(head) or data.get("description") or ""
        rows.append(f"| `{path.stem}` | {_cell(about)} |")
    return rows


def _per_choice(group: str) -> dict[str, dict[str, list[str]]]:
    """Each field's values as the group's choices set them: {field: {value shown: [choices]}}."""
    found: dict[str, dict[str, list[str]]] = {}
    for path in sorted((CONF_DIR / group).glob("*.yaml")):
        if path.name.startswith("_"):
            continue
        for name, value in (yaml.safe_load(path.read_text()) or {}).items():
            if name != "defaults" and not isinstance(value, dict):
                found.setdefault(name, {}).setdefault(_default(value), []).append(path.stem)
    return found


def _default_cell(value, set_by: dict[str, list[str]]) -> str:
    """The field's default, then what each choice that sets it otherwise sets (`w8a16` in w4a16, rtn)."""
    shown = _default(value)
    others = [f"{v} in {', '.join(choices)}" for v, choices in set_by.items() if v != shown]
    if value == "???":
        return "set by each choice: " + "; ".join(others) if others else shown
    return shown + ("; " + "; ".join(others) if others else "")


@cache
def accepted() -> dict[str, tuple[str, ...]]:
    """The fields whose values are a fixed set, read from the code that refuses the others: every
    `check_choice("<group>.<field>", value, ALLOWED)` under src/, ALLOWED evaluated in its module."""
    src = CONF_DIR.parent / "src"
    out: dict[str, tuple[str, ...]] = {}
    for path in sorted(src.rglob("*.py")):
        tree = ast.parse(path.read_text())
        calls = [
            node
            for node in ast.walk(tree)
            if isinstance(node, ast.Call)
            and getattr(node.func, "id", getattr(node.func, "attr", "")) == "check_choice"
            and len(node.args) == 3
            and isinstance(node.args[0], ast.Constant)
        ]
        if not calls:
            continue
        module = importlib.import_module(".".join(path.relative_to(src.parent).with_suffix("").parts))
        for call in calls:
            allowed = eval(ast.unparse(call.args[2]), vars(module))  # noqa: S307 - the project's own constants
            out[call.args[0].value] = tuple(allowed)
    return out


def _type_cell(key: str, type_name: str) -> str:
    values = accepted().get(key)
    return f"`{_cell(type_name)}`" + (f": one of {', '.join(f'`{v}`' for v in values)}" if values else "")


def _fields(group: str) -> list[str]:
    classes, registry = GROUPS[group]
    fields_file = CONF_DIR / group / "_fields.yaml"
    defaults = yaml.safe_load(fields_file.read_text()) if fields_file.exists() else {}
    comments = yaml_comments(fields_file) if fields_file.exists() else {}
    owners: dict[str, list[str]] = {}
    types: dict[str, str] = {}
    class_notes: dict[str, str] = {}
    kinds = registry.items() if registry else []
    for cls in classes + [c for _, c in kinds]:
        # the first class that says something about a field wins: the shared base classes come first
        class_notes = {**class_comments(cls), **class_notes}
        for f in dataclasses.fields(cls):
            types.setdefault(f.name, str(f.type))
            if f.default is not dataclasses.MISSING and f.name not in defaults:
                defaults[f.name] = f.default
    for kind, cls in kinds:
        for f in dataclasses.fields(cls):
            owners.setdefault(f.name, []).append(kind)
    names = list(defaults) + [n for n in types if n not in defaults]
    set_by = _per_choice(group)
    rows = ["| field | type | default | read by | meaning |", "|---|---|---|---|---|"]
    for name in names:
        if name.startswith("_") or name == "defaults" or f"{group}.{name}" in INTERNAL:
            continue
        read_by = owners.get(name, [])
        every = f"every {registry.axis} {registry.selector}" if registry else ""
        read = (every if len(read_by) == len(kinds) else ", ".join(read_by)) if registry else ""
        if registry and not read_by:
            read = BASE_READER.get(group, every)
        rows.append(
            f"| `{group}.{name}` | {_type_cell(f'{group}.{name}', types.get(name) or 'str')} | "
            f"{_cell(_default_cell(defaults.get(name), set_by.get(name, {})))} | "
            f"{read} | {_cell(comments.get(name) or class_notes.get(name, ''))} |"
        )
    return rows


def _top_level() -> list[str]:
    path = CONF_DIR / "config.yaml"
    data = yaml.safe_load(path.read_text())
    comments = yaml_comments(path)
    rows = ["| setting | default | meaning |", "|---|---|---|"]
    for key, value in data.items():
        if key in ("defaults", "hydra"):
            continue
        if isinstance(value, dict):
            for sub, subvalue in value.items():
                rows.append(
                    f"| `{key}.{sub}` | {_cell(_default(subvalue))} | "
                    f"{_cell(comments.get(f'{key}.{sub}') or comments.get(key, ''))} |"
                )
        else:
            rows.append(f"| `{key}` | {_cell(_default(value))} | {_cell(comments.get(key, ''))} |")
    return rows


def _plugin(conf: type, prefix: str, skip: tuple[str, ...] = ()) -> list[str]:
    """A Hydra plugin's settings (`hydra.sweeper.*`, `hydra.launcher.*`), from its config class."""
    notes = class_comments(conf)
    rows = ["| setting | type | default | meaning |", "|---|---|---|---|"]
    for f in dataclasses.fields(conf):
        if f.name.startswith("_") or f.name in skip:
            continue
        default = f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default
        kind = getattr(f.type, "__name__", str(f.type)).replace("typing.", "")
        rows.append(
            f"| `{prefix}.{f.name}` | `{_cell(kind)}` | {_cell(_default(default))} | {_cell(notes.get(f.name, ''))} |"
        )
    return rows


def render() -> str:
    out = [
        "The defaults a job composes are in `conf/config.yaml`; each group below is a folder of `conf/`, "
        "one YAML file per choice (`model=llama-2-7b`), and any field can be overridden on the command line "
        "(`precision.awq_grid=10`). A field that no chosen entry reads is refused in one line.",
        "",
        "## Top level (`conf/config.yaml`)",
        "",
        *_top_level(),
        "",
    ]
    for group in GROUPS:
        out += [f"## `{group}`", "", "### Choices", "", *_choices(group), "", "### Fields", "", *_fields(group), ""]
    from hydra_plugins.quantspec_ray.ray_launcher import RayLauncherConf
    from hydra_plugins.quantspec_search.search_sweeper import SearchSweeperConf

    out += [
        "## `hydra/sweeper=search`",
        "",
        "The search over the sweep's axes (docs: how-to/search.md); "
        "`hydra/sweeper=rounds`, the default, takes `rounds` and `busy_reruns` above.",
        "",
        *_plugin(SearchSweeperConf, "hydra.sweeper", skip=("params", "max_batch_size")),
        "",
        "## `hydra/launcher=ray`",
        "",
        "Jobs placed on a Ray cluster of machines, each job on a node that advertises its hardware profile's "
        "resource (`hardware.resource`) and a free slot (docs: how-to/lab.md); `hydra/launcher=basic`, the "
        "default, runs them one after another here.",
        "",
        *_plugin(RayLauncherConf, "hydra.launcher"),
        "",
    ]
    return "\n".join(out)
