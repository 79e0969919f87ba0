"""Another runtime's jobs in a sweep: perplexity per engine, and the fp32 export a runtime's job left in its cache."""

from __future__ import annotations

import json
from pathlib import Path

from src.assembly import schema  # noqa: F401 - the groups' schemas, which every composition is typed by
from tests.support.cli import fresh_cache, run_cli


def perplexity_by_engine(tmp_path: Path, engines: str, *overrides: str) -> dict[str, float]:
    """`task=perplexity` on the tiny Llama at fp32, one job per engine in `engines` (a sweep's list), in a
    store and cache of their own: each engine's perplexity."""
    from mlflow.tracking import MlflowClient

    store = f"sqlite:///{tmp_path / 'mlflow.db'}"
    out = run_cli(
        [
            "-m",
            "model=tiny-llama",
            f"engine={engines}",
            "precision=fp32",
            "task=perplexity",
            "task.window=64",
            "task.windows=2",
            f"tracking.uri={store}",
            f"hydra.sweep.dir={tmp_path / 's'}",
            *overrides,
        ],
        env={"QUANTSPEC_CACHE": str(fresh_cache(tmp_path / "cache"))},
    )
    assert out.returncode == 0, out.stderr[-2000:]
    client = MlflowClient(store)
    runs = client.search_runs(
        [client.get_experiment_by_name("quantspec").experiment_id], "tags.`quantspec.role` = 'job'"
    )
    return {r.data.tags["engine"]: r.data.metrics["perplexity"] for r in runs}


def fp32_export(cache: Path, runtime: str) -> tuple[Path, dict]:
    """The fp32 export a job on engine `runtime` made in `cache` (perplexity_by_engine's), and its manifest."""
    from src.common.cache import MANIFEST

    (folder,) = (p for p in (cache / runtime).glob("*-fp32*") if p.is_dir() and not p.name.startswith("."))
    return folder, json.loads((folder / MANIFEST).read_text())
