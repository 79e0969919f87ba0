"""A new SQLite store (src.tracking.store.blank): a copy of the empty store cached once per MLflow version, alike to
one MLflow makes itself; a damaged template or a cache that cannot hold one costs only the time MLflow's migrations
take."""

import logging
import sqlite3

import mlflow

from src.tracking.store import blank
from src.tracking.store.experiment import Store


def _experiments(db) -> list:
    with sqlite3.connect(db) as con:
        return con.execute("select experiment_id, name, artifact_location from experiments order by 1").fetchall()


def test_a_new_store_is_the_cached_empty_one_copied_and_alike_to_one_mlflow_makes(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # MLflow's Default experiment keeps its artifacts under the working directory
    monkeypatch.setenv("QUANTSPEC_CACHE", str(tmp_path / "cache"))
    template = tmp_path / "cache" / "stores" / f"empty-mlflow-{mlflow.__version__}.db"
    Store(f"sqlite:///{tmp_path / 'first.db'}", "quantspec")  # makes the template, then the store from it
    assert template.is_file() and _experiments(template) == []  # the Default experiment is each store's own
    Store(f"sqlite:///{tmp_path / 'copied.db'}", "quantspec")
    mlflow_made = tmp_path / "mlflow.db"
    blank._open(mlflow_made)  # MLflow's own first open: its migrations
    Store(f"sqlite:///{mlflow_made}", "quantspec")
    assert _experiments(tmp_path / "first.db") == _experiments(tmp_path / "copied.db") == _experiments(mlflow_made)
    assert [row[1] for row in _experiments(mlflow_made)] == ["Default", "quantspec"]
    assert not list(tmp_path.glob(".*.new-*")) and not list(template.parent.glob(".*.new-*"))  # no scratch left


def test_a_damaged_template_is_made_anew_and_a_cache_that_cannot_hold_one_costs_only_time(
    tmp_path, monkeypatch, caplog
):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("QUANTSPEC_CACHE", str(tmp_path / "cache"))
    template = tmp_path / "cache" / "stores" / f"empty-mlflow-{mlflow.__version__}.db"
    template.parent.mkdir(parents=True)
    template.write_bytes(b"half a file, cut by a full disk")
    with caplog.at_level(logging.WARNING, logger="quantspec"):
        store = Store(f"sqlite:///{tmp_path / 'a.db'}", "quantspec")
    assert "did not open" in caplog.text and "making the schema anew" in caplog.text
    store.client.create_run(store.experiment_id)  # a whole store
    Store(f"sqlite:///{tmp_path / 'b.db'}", "quantspec")
    assert _experiments(template) == []  # the next store made the template again
    # a cache that is a file: no template anywhere, each store made by MLflow's migrations
    (tmp_path / "file").write_text("")
    monkeypatch.setenv("QUANTSPEC_CACHE", str(tmp_path / "file"))
    store = Store(f"sqlite:///{tmp_path / 'c.db'}", "quantspec")
    assert [row[1] for row in _experiments(tmp_path / "c.db")] == ["Default", "quantspec"]
    store.client.create_run(store.experiment_id)
