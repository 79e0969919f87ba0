"""The command reference, generated: each command's own usage, as the command itself prints it (`--help`, or
its module docstring), so a renamed option changes this page on the next build."""

from __future__ import annotations

import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
MODULES = ("src.run", "src.report", "src.regress", "src.sync")
SHELL = ("scripts/setup", "scripts/tracking-server")


def _help(argv: list[str]) -> str:
    done = subprocess.run([sys.executable, *argv, "--help"], cwd=ROOT, capture_output=True, text=True, timeout=120)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)} --help failed ({done.returncode}): {done.stderr.strip()[-300:]}")
    return done.stdout.strip()


def _module_doc(name: str) -> str:
    # src.run is Hydra's app: its --help is Hydra's listing of the whole config, which the configuration
    # reference gives field by field; its docstring is its usage.
    if name == "src.run":
        import importlib

        return importlib.import_module(name).__doc__.strip()
    return _help(["-m", name])


def _shell_doc(path: str) -> str:
    lines = []
    for line in (ROOT / path).read_text().splitlines()[1:]:
        if not line.startswith("#"):
            break
        lines.append(line[2:] if line.startswith("# ") else line[1:])
    return "\n".join(lines).strip()


def _block(title: str, text: str) -> list[str]:
    return [f"## `{title}`", "", "```text", text, "```", ""]


def render() -> str:
    # the runnable scripts: the benchmarks, the docs' check and the README's headline (bench.py, jobs.py and
    # peer.py are their helpers)
    scripts = sorted(
        f"scripts.{p.stem}"
        for p in (ROOT / "scripts").glob("*.py")
        if p.stem.startswith(("bench_", "check_", "headline"))
    )
    with ThreadPoolExecutor(4) as pool:
        modules = list(pool.map(_module_doc, MODULES))
        helps = list(pool.map(lambda s: _help(["-m", s]), scripts))
    out = [
        "Every command quantspec ships, with the usage it prints itself. Run each with `.venv/bin/python` "
        "from the project's root.",
        "",
    ]
    for name, text in zip(MODULES, modules):
        out += _block(f"python -m {name}", text)
    for name, text in zip(scripts, helps):
        out += _block(f"python -m {name}", text)
    for name in SHELL:
        out += _block(f"bash {name}", _shell_doc(name))
    return "\n".join(out)
