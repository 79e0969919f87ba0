"""src/'s imports: every module imports in a fresh interpreter without the optional runtimes, and a function
imports nothing of src (a loop dodged inside a function is still a loop) and no other module without its
reason beside it. The rooms' order itself is import-linter's contracts in pyproject.toml (lint-imports)."""

from __future__ import annotations

import ast
import pkgutil
import subprocess
import sys

from tests.support.cli import ROOT

OPTIONAL = (
    "openvino",
    "onnxruntime",
    "onnxruntime_genai",
    "optimum",
    "llama_cpp",
    "ray",
    "psycopg",
    "lm_eval",
    "optuna",
    "datasets",
)
# A runtime's own program, run as a process of its own only where its extra is installed: it imports the runtime.
RUNTIME_PROGRAMS = ("src.engine.runtimes.ort_genai.builder",)


def _modules() -> list[str]:
    import src

    found = ["src"] + [m.name for m in pkgutil.walk_packages(src.__path__, "src.")]
    return [name for name in found if name not in RUNTIME_PROGRAMS]


def test_every_module_imports_in_a_fresh_interpreter_without_the_optional_runtimes():
    blocker = f"""
import sys
for name in {OPTIONAL!r}:   # as if not installed: import fails, importlib.util.find_spec answers None
    sys.modules[name] = None
import importlib
for name in {_modules()!r}:
    importlib.import_module(name)
print("imported", len({_modules()!r}))
"""
    out = subprocess.run([sys.executable, "-c", blocker], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0 and "imported" in out.stdout, out.stderr[-3000:]


def _function_imports():
    for path in sorted((ROOT / "src").rglob("*.py")):
        text = path.read_text()
        lines = text.splitlines()
        for fn in ast.walk(ast.parse(text)):
            if isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
                for node in ast.walk(fn):
                    if isinstance(node, (ast.Import, ast.ImportFrom)):
                        names = [a.name for a in node.names] if isinstance(node, ast.Import) else [node.module or ""]
                        yield path.relative_to(ROOT), node.lineno, names, lines[node.lineno - 1], lines[node.lineno - 2]


def test_functions_import_nothing_of_src_and_say_why_they_import_late():
    found = list(_function_imports())
    assert found, "the scan found no import inside a function: it would pass whatever the code holds"
    of_src = [f"{p}:{n}" for p, n, names, _, _ in found if any(m == "src" or m.startswith("src.") for m in names)]
    assert not of_src, (
        f"src imported inside a function (import it at the top; a loop means a room is misplaced): {of_src}"
    )
    silent = [f"{p}:{n}" for p, n, _, line, above in found if "#" not in line and not above.strip().startswith("#")]
    assert not silent, f"imports inside a function with no reason beside them: {silent}"


def test_what_a_user_reads_is_said_through_one_voice():
    """Every `quantspec: ` line comes from src.common.say (its prefix in one place), not a hand-typed string."""
    typed = []
    for path in sorted((ROOT / "src").rglob("*.py")):
        if path.name == "say.py":
            continue
        tree = ast.parse(path.read_text())
        docstring = tree.body[0].value if tree.body and isinstance(tree.body[0], ast.Expr) else None
        for node in ast.walk(tree):
            if node is docstring:
                continue
            parts = node.values if isinstance(node, ast.JoinedStr) else [node]
            first = parts[0] if parts else None
            if isinstance(first, ast.Constant) and isinstance(first.value, str):
                if first.value.lstrip("\n").startswith("quantspec: ") and "\n" not in first.value.strip():
                    typed.append(f"{path.relative_to(ROOT)}:{node.lineno}")
    assert not typed, f"lines that type the prefix by hand (say() it instead): {typed}"
