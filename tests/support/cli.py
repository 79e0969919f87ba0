"""Composing the real conf/ tree as src.run does, and running a command in this process or as a real one (its
environment, a throwaway cache)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from src.assembly import schema  # noqa: F401 - the groups' schemas, which every composition is typed by
from tests.support.inprocess import Ran, run_in_process
from tests.support.kernels import KERNELS

ROOT = Path(__file__).resolve().parents[2]  # the repository
CONF = ROOT / "conf"


def compose_job(overrides: list[str]) -> tuple[dict, dict]:
    """The resolved job config (without hydra's node) and Hydra's group choices, as src.run sees them."""
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        cfg = compose("config", overrides=overrides, return_hydra_config=True)
        choices = {k: v for k, v in cfg.hydra.runtime.choices.items() if not k.startswith("hydra") and v}
        # hydra's own node has job-time fields (hydra.job.num) that only a launcher fills in.
        raw = {
            k: OmegaConf.to_container(cfg[k], resolve=True) if OmegaConf.is_config(cfg[k]) else cfg[k]
            for k in cfg
            if k != "hydra"
        }
    return raw, choices


def overridden(base: list[str], *args: str) -> list[str]:
    """`base`'s overrides with `args` after them, each key of `args` taken out of `base` first: a command line
    gives a setting once (src.run refuses one given twice)."""
    keys = {a.partition("=")[0] for a in args}
    return [*(a for a in base if a.partition("=")[0] not in keys), *args]


def run_cli(args: list[str], module: str = "src.run", env: dict | None = None, cwd: Path | None = None) -> Ran:
    """`python -m <module> *args` (src.run, src.report, src.regress or src.sync) run in this process, with `env`
    added to its environment: exit code, stdout and stderr as a child's would be. For a test of what a command
    says, returns and records; a test of the process itself (a signal, a kill, a lock held by another process, a
    timeout) starts a real one with run_process."""
    return run_in_process(args, module, env, cwd)


def run_process(
    args: list[str], timeout: int = 600, module: str = "src.run", cwd: Path = ROOT, env: dict | None = None
) -> subprocess.CompletedProcess:
    """`python -m <module> *args` as a real child process (tests/e2e/): where the process is what is tested."""
    return subprocess.run(
        [sys.executable, "-m", module, *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=timeout,
        env=cli_env(env),
    )


def cli_env(extra: dict | None = None) -> dict:
    """The environment of a quantspec child process, importable from any working directory."""
    return {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONPATH": str(ROOT), **(extra or {})}


def fresh_cache(path: Path, kernels: bool = True) -> Path:
    """A cache directory of its own for a test's jobs (their QUANTSPEC_CACHE or cache_dir), holding what this
    test session made once: the kernels (a job's own kernel build takes ~20 s here, and only the tests of kernel
    builds, tests/e2e/test_build_faults.py, need to watch one happen; `kernels=False` leaves them out) and the empty
    tracking store every new store is copied from (src.tracking.store.blank: 2.8 s to make here). Copies, not
    links: a test may damage or lock what is in its cache. Called again on the same path it leaves the kernels
    there as they are: a command run in this process may have loaded them, and a loaded library written over in
    place crashes the process."""
    from src import kernels as built
    from src.tracking.store import blank

    if kernels and not (path / "kernels").exists() and built.load(KERNELS):  # built once for the session
        shutil.copytree(KERNELS, path / "kernels", ignore=shutil.ignore_patterns(".*.lock"))
    template = blank.empty_template()  # the session's own cache: made once
    if template is not None and not (path / "stores" / template.name).exists():
        (path / "stores").mkdir(parents=True, exist_ok=True)
        shutil.copyfile(template, path / "stores" / template.name)
    return path
