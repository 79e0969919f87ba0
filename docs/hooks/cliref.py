"""The command reference, generated: for each command its own usage text (its docstring, as `--help` prints it),
then its settings, grouped by purpose, as tables of kind, default, accepted values and meaning, read from the
command's own settings (src.common.settings), so a renamed or added setting changes this page on the next build;
where a walk page shows the command run with its output, a link to it."""

from __future__ import annotations

import contextlib
import io
import runpy
import sys
from pathlib import Path

from src.common.settings import show

ROOT = Path(__file__).resolve().parents[2]
MODULES = ("src.run", "src.serve", "src.report", "src.regress", "src.sync")
SHELL = ("scripts/setup", "scripts/tracking-server", "scripts/build_llama_server")


def _help(module: str) -> str:
    """What `python -m <module> --help` prints, run here as `python -m` runs it (the module as __main__), not in
    a process of its own: the build already imports every command (for its settings), and a new interpreter per
    command cost a minute of CI on 2 cores."""
    out, argv = io.StringIO(), sys.argv
    sys.argv = [module, "--help"]
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
            runpy.run_module(module, run_name="__main__", alter_sys=True)
        code = 0
    except SystemExit as done:
        code = done.code if isinstance(done.code, int) else (0 if done.code is None else 1)
    finally:
        sys.argv = argv
    if code != 0:
        raise RuntimeError(f"python -m {module} --help failed ({code}): {out.getvalue().strip()[-300:]}")
    return out.getvalue().strip()


def _module_doc(name: str) -> str:
    # src.run is Hydra's app: its --help is Hydra's listing of the whole config, which the configuration
    # reference gives field by field; its docstring is its usage.
    if name == "src.run":
        import importlib

        return importlib.import_module(name).__doc__.strip()
    return _help(name)


def _shell_doc(path: str) -> str:
    lines = []
    for line in (ROOT / path).read_text().splitlines()[1:]:
        if not line.startswith("#"):
            break
        lines.append(line[2:] if line.startswith("# ") else line[1:])
    return "\n".join(lines).strip()


def _block(title: str, text: str) -> list[str]:
    return [f"## `{title}`", "", "```text", text, "```", ""]


# Where the walk runs a command and shows what it prints
EXAMPLES = {
    "src.run": "[1. A first sweep](../getting-started.md) and every step of the walk",
    "src.report": "[1. A first sweep](../getting-started.md#read-the-report), "
    "[2. Precisions in rounds](../walk/2-rounds.md), [3. Quality beside speed](../walk/3-quality.md)",
    "src.regress": "[5. Compare with an older sweep](../walk/5-regress.md)",
    "src.serve": "[8. Serving many requests](../walk/8-serving.md)",
}


def _command(name: str):
    """The module's Command (its settings), or None for one without (src.run is Hydra's; headline has none)."""
    import importlib

    if name == "src.report":
        from src.tracking.readback.reporting.settings import command

        return command(importlib.import_module(name).__doc__ or "")
    if name == "src.regress":
        from src.tracking.readback.regression import COMMAND

        return COMMAND
    if name == "src.sync":
        from src.tracking.store.sync import COMMAND

        return COMMAND
    return getattr(importlib.import_module(name), "COMMAND", None)


def _kind(setting) -> str:
    if isinstance(setting.default, dict):
        return "named parts"
    kind = setting.kind or (type(setting.default) if setting.default is not None else str)
    return {
        bool: "true/false",
        int: "whole number",
        float: "number",
        str: "text",
        tuple: "list",
        list: "repeatable",
    }.get(kind, show(kind))


def _settings(command) -> list[str]:
    """The settings as tables, one per purpose, in the order the command lists them."""
    groups: dict[str, list] = {}
    for setting in command.settings:
        groups.setdefault(setting.purpose or "settings", []).append(setting)
    out = []
    for purpose, settings in groups.items():
        out += [f"**{purpose[0].upper() + purpose[1:]}**", "", "| setting | kind | default | accepted | meaning |"]
        out.append("|---|---|---|---|---|")
        for setting in settings:
            name = setting.name
            if isinstance(setting.default, dict):
                name += ".<" + "\\|".join(setting.parts or tuple(setting.default)) + ">"
            accepted = ", ".join(f"`{c}`" for c in setting.choices) or (
                "a config group's choice" if isinstance(setting.default, dict) else "any"
            )
            meaning = setting.meaning.replace("|", "\\|").replace("<", "&lt;")  # text, never a tag
            out.append(f"| `{name}` | {_kind(setting)} | `{show(setting.default)}` | {accepted} | {meaning} |")
        out.append("")
    return out


def _section(name: str, text: str) -> list[str]:
    command = _command(name)
    doc = command.doc if command is not None else text
    out = [f"## `python -m {name}`", "", "```text", doc.strip(), "```", ""]
    if command is not None and command.settings:
        out += _settings(command)
    if name in EXAMPLES:
        out += [f"Run, with what it prints: {EXAMPLES[name]}.", ""]
    return out


def render() -> str:
    # the runnable scripts: the benchmarks, the docs' check and the README's headline (bench.py, jobs.py and
    # peer.py are their helpers)
    scripts = sorted(
        f"scripts.{p.stem}"
        for p in (ROOT / "scripts").glob("*.py")
        if p.stem.startswith(("bench_", "check_", "headline"))
    )
    # Every command's --help is run once here, so one that breaks fails the build; its text is shown only for a
    # command without settings (src.run, headline): the others' sections are read from their Command instead.
    modules = [_module_doc(name) for name in MODULES]
    helps = [_help(name) for name in scripts]
    out = [
        "Every command quantspec ships: its usage, then its settings grouped by purpose (`key=value` on the command "
        "line; `--help` prints the same). Run each with `.venv/bin/python` from the project's root. The settings of "
        "`python -m src.run` are the [configuration reference](config.md)'s.",
        "",
    ]
    for name, text in zip(MODULES, modules):
        out += _section(name, text)
    for name, text in zip(scripts, helps):
        out += _section(name, text)
    for name in SHELL:
        out += _block(f"bash {name}", _shell_doc(name))
    return "\n".join(out)
