"""MkDocs hook: the pages made from the code at build time (mkdocs.yml `hooks:`).

A page holds a marker where generated text goes, so its prose stays hand-written and its tables cannot rot:
`<!-- generated: config -->` (every config group and field: configref.py), `<!-- generated: cli -->` (every
command's usage: cliref.py), `<!-- generated: tracking -->` (every metric, param and tag: src.tracking.store.catalog),
`<!-- results: <page> -->` (a benchmark page's entries: src.common.benchpage).
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
HOOKS = Path(__file__).resolve().parent


def _on_path() -> None:
    # MkDocs loads hooks by file path, not as a package: the project (for src.*) and this folder (for the
    # sibling generators) go on sys.path when a page needs them
    for path in (str(ROOT), str(HOOKS)):
        if path not in sys.path:
            sys.path.insert(0, path)


MARKER = re.compile(r"<!-- (generated|results): ([\w-]+) -->")


def _generated(name: str) -> str:
    _on_path()
    if name == "config":
        import configref

        return configref.render()
    if name == "cli":
        import cliref

        return cliref.render()
    if name == "tracking":
        from src.tracking.store import catalog

        return catalog.render()
    raise ValueError(f"no generated page {name!r}")


def _replace(match: re.Match) -> str:
    kind, name = match.groups()
    if kind == "generated":
        return _generated(name)
    _on_path()
    from src.common import benchpage

    return benchpage.render(benchpage.load(name))


def on_page_markdown(markdown: str, page, config, files) -> str:
    return MARKER.sub(_replace, markdown)
