"""A package's __init__.py says what the package is and what it offers; its code lives in modules a newcomer finds by
name (src/kernels/loader.py, src/engine/runtimes/<name>/runtime.py, src/engine/runtimes/exports.py)."""

import ast
from pathlib import Path

SRC = Path(__file__).resolve().parents[2] / "src"
MAX_LOGIC_LINES = 40


def logic_lines(path: Path) -> int:
    """Lines of a module that are neither its docstring, an import, nor its __all__."""
    lines = 0
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            continue
        if isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant) and isinstance(node.value.value, str):
            continue
        if isinstance(node, ast.Assign) and any(getattr(t, "id", "") == "__all__" for t in node.targets):
            continue
        lines += node.end_lineno - node.lineno + 1
    return lines


def test_no_package_keeps_its_logic_in_its_init():
    heavy = {
        str(p.relative_to(SRC.parent)): n for p in SRC.rglob("__init__.py") if (n := logic_lines(p)) > MAX_LOGIC_LINES
    }
    assert not heavy, f"logic in __init__.py (move it to a module named for what it does): {heavy}"
    assert logic_lines(SRC / "engine" / "runtimes" / "exports.py") > MAX_LOGIC_LINES  # the count sees code
