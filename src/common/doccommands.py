"""The commands the README and docs/ show, read out of their markdown: for the checks that keep them true
(tests/docs/test_docs.py composes every `python -m src.run` one; scripts/check_docs.py runs the blocks marked
`<!-- runnable -->`, and checks each one's shown output, the block marked `<!-- output -->` right after it)."""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass
from pathlib import Path

from src.common.environment import PROJECT_ROOT

RUNNABLE = "<!-- runnable -->"
OUTPUT = "<!-- output -->"
FENCE = re.compile(r"^```(\w*)\s*$")


@dataclass(frozen=True)
class Block:
    path: Path
    line: int  # where the block starts (1-based)
    text: str
    runnable: bool  # marked <!-- runnable --> right above it: the docs check runs it
    output: bool = False  # marked <!-- output -->: what the runnable block before it prints, in excerpt
    end: int = 0  # the line of its closing fence (1-based), for rewriting an output block in place

    @property
    def where(self) -> str:
        return f"{self.path.relative_to(PROJECT_ROOT)}:{self.line}"


def pages(root: Path = PROJECT_ROOT) -> list[Path]:
    return [root / "README.md", *sorted((root / "docs").rglob("*.md"))]


def blocks(path: Path) -> list[Block]:
    """A page's code: fenced blocks, and indented ones (four spaces after a blank line)."""
    lines = path.read_text().splitlines()
    found: list[Block] = []
    i = 0
    while i < len(lines):
        marked = i > 0 and lines[i - 1].strip() == RUNNABLE
        shown = i > 0 and lines[i - 1].strip() == OUTPUT
        if FENCE.match(lines[i]):
            j = i + 1
            while j < len(lines) and not lines[j].startswith("```"):
                j += 1
            found.append(Block(path, i + 1, "\n".join(lines[i + 1 : j]), marked, shown, j + 1))
            i = j + 1
            continue
        if lines[i].startswith("    ") and (i == 0 or not lines[i - 1].strip()):
            j = i
            while j < len(lines) and (lines[j].startswith("    ") or not lines[j].strip()):
                j += 1
            text = "\n".join(line[4:] for line in lines[i:j]).strip("\n")
            found.append(Block(path, i + 1, text, False))
            i = j
            continue
        i += 1
    return found


def commands(text: str) -> list[list[str]]:
    """The shell commands in a block, continuation lines joined, comments dropped, split into words."""
    out = []
    for line in text.replace("\\\n", " ").splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        try:
            words = shlex.split(line, comments=True)
        except ValueError:
            continue
        if words:
            out.append(words)
    return out


def module_args(words: list[str], module: str) -> list[str] | None:
    """The arguments of `python -m <module>` in one command (after any `&&`), or None."""
    for start in range(len(words)):
        if words[start : start + 2] == ["-m", module] and start and words[start - 1].endswith("python"):
            rest = words[start + 2 :]
            return rest[: rest.index("&&")] if "&&" in rest else rest
    return None
