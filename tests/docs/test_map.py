"""The docs' map of the house matches the tree: docs/design/architecture.md's layout names only folders and files
that exist (each entry where the map puts it, each file its descriptions mention somewhere in the repository), and
every page's backticked repository path and dotted src module resolves."""

import importlib
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
TOP = ("src", "scripts", "docs", "conf", "tests", "hydra_plugins", "examples")
ROOTS = "|".join(TOP)
# an entry: a line of the map starting (after its indent) with a path, a folder/ or a file, then two spaces
ENTRY = re.compile(rf"^(\s*)((?:{ROOTS})/[\w/.]*|[\w.]+/|[\w]+\.py)(?=\s{{2,}}|$)")
MENTIONED = re.compile(r"\b([a-z_0-9]+\.(?:py|cpp|h))\b")
NOT_FILES = {"llama.cpp"}  # a project's name, not a file of this one


def _map_problems(text: str) -> list[str]:
    problems, stack = [], []  # stack: (indent, folder) of the entries the current line sits under
    files = {p.name for p in ROOT.rglob("*") if ".venv" not in p.parts and ".git" not in p.parts}
    for line in text.splitlines():
        m = ENTRY.match(line)
        if m:
            indent, name = len(m.group(1)), m.group(2)
            while stack and stack[-1][0] >= indent:
                stack.pop()
            if name.split("/")[0] in TOP:
                path = ROOT / name
            elif stack:
                path = stack[-1][1] / name
            else:
                continue
            if not path.exists():
                problems.append(f"{path.relative_to(ROOT)} (an entry of the map)")
            if name.endswith("/"):
                stack.append((indent, path))
            said = line[m.end() :]
        elif stack and line.startswith(" " * 20):
            said = line
        else:
            continue
        problems += [f"{f} (named in {stack[-1][1].relative_to(ROOT)}'s entry)" for f in MENTIONED.findall(said)
                     if f not in files and f not in NOT_FILES]  # fmt: skip
    return problems


def test_the_architecture_map_names_only_what_is_in_the_tree():
    assert _map_problems((ROOT / "docs" / "design" / "architecture.md").read_text()) == []


def test_the_check_finds_a_module_that_is_gone():
    stale = "    src/tracking/          rooms\n      readback/            read back\n        quality.py         gone\n"
    assert _map_problems(stale) == ["src/tracking/readback/quality.py (an entry of the map)"]
    assert _map_problems("    src/engine/            python_step.py (x), nowhere.py (y)\n") == [
        "nowhere.py (named in src/engine's entry)"
    ]


def _resolves(dotted: str) -> bool:
    parts = dotted.split(".")
    for i in range(len(parts), 1, -1):
        try:
            obj = importlib.import_module(".".join(parts[:i]))
        except ModuleNotFoundError:
            continue
        for attr in parts[i:]:
            obj = getattr(obj, attr, None)
        return obj is not None
    return False


PAGES = [ROOT / "README.md", *sorted(p for p in (ROOT / "docs").rglob("*.md") if "results" not in p.parts)]
EXAMPLES = {"src.engine.nope"}  # add-runtime.md's example of a module that does not import


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_a_pages_repository_paths_and_modules_exist(page):
    text = page.read_text()
    missing = []
    for m in re.finditer(rf"`((?:{ROOTS})/[^`\s]*)`", text):
        path = m.group(1).rstrip(".,:;").split("::")[0].split(":")[0]
        if not any(c in path for c in "<*{$") and not (ROOT / path).exists():
            missing.append(path)
    missing += [d for d in re.findall(r"\b(src(?:\.[a-z_0-9]+)+)\b", text) if d not in EXAMPLES and not _resolves(d)]
    assert missing == []
