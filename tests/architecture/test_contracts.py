"""The import-linter contracts on src/tracking/'s rooms hold on the code and break on a violation: each
planted import below, in a copy of src/, is named by `lint-imports` as a broken contract."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

from tests.support.cli import ROOT

LINT = Path(sys.executable).parent / "lint-imports"
# (module file, the import planted in it, the contract it breaks)
PLANTED = [
    ("src/tracking/store/owner.py", "src.tracking.sweep.record", "tracking's rooms import only downward"),
    ("src/tracking/view/ui.py", "src.tracking.store.names", "tracking's rooms import only downward"),
    ("src/tracking/readback/sweeps.py", "src.tracking.sweep.naming", "tracking's rooms import only downward"),
    ("src/tracking/store/locks.py", "omegaconf", "tracking's store and view know no Hydra"),
    ("src/tracking/view/ui.py", "src.assembly.config", "tracking's store and view know no Hydra"),
]


def _lint(root: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [str(LINT), "--no-cache"], cwd=root, capture_output=True, text=True, timeout=300, env={"PYTHONPATH": str(root)}
    )


def test_the_tracking_contracts_hold_and_break_on_each_planted_import(tmp_path):
    assert _lint(ROOT).returncode == 0
    for file, module, contract in PLANTED:
        copy = tmp_path / module.replace(".", "_")
        shutil.copytree(ROOT / "src", copy / "src", ignore=shutil.ignore_patterns("__pycache__", "*.so", "build"))
        shutil.copy(ROOT / "pyproject.toml", copy)
        with (copy / file).open("a") as f:
            f.write(f"\nimport {module}  # noqa: E402, F401 - planted\n")
        out = _lint(copy)
        assert out.returncode != 0, f"{file} importing {module} was not caught"
        broken = out.stdout.split("Broken contracts", 1)[-1]
        assert contract in broken and module in broken, out.stdout[-3000:]
