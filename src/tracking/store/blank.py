"""A new SQLite tracking store: MLflow's schema made once per MLflow version, kept in the cache, and copied.

MLflow makes a new SQLite store's schema by running all its migrations: 2.8 s on a 2-core EPYC, for every store a
sweep or a test makes, while opening a copy of a finished one takes 0.09 s. For one MLflow version the schema is the
same every time, so it is made once, emptied of its experiments, kept in the cache
(`stores/empty-mlflow-<version>.db`), and copied. The copy's first open (here, before it is put in place) makes the
Default experiment with the opener's artifact root, as MLflow's own first open would have. Where the cache cannot
hold the template (read-only, full) or the template does not open, the store is made as before, migrations and all.

Either way the store is made in a scratch file and renamed into place: killed at any point, it leaves either no
store or a whole one (MLflow's own first open, killed mid-way, left tables that make every later open fail:
`table ... already exists`)."""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import sqlite3
from pathlib import Path

import mlflow
from mlflow.store.tracking.sqlalchemy_store import SqlAlchemyStore
from mlflow.tracking import MlflowClient

from src.common.paths import cache_root

log = logging.getLogger("quantspec")


def new_sqlite_store(db: Path) -> None:
    """Make the SQLite store `db` (which does not exist yet): a copy of the cached template where there is one
    that opens, else MLflow's migrations."""
    db.parent.mkdir(parents=True, exist_ok=True)
    scratch = db.with_name(f".{db.name}.new-{os.getpid()}")
    scratch.unlink(missing_ok=True)
    template = empty_template()
    if template is not None:
        try:
            shutil.copyfile(template, scratch)
        except OSError as err:  # this store's disk, not the template: the slow way below says what is wrong
            log.debug("could not copy the cached empty store (%s); making the schema in place", err)
            template = None
        else:
            try:
                _open(scratch)
            except Exception as err:  # noqa: BLE001 - a template that does not open: removed, the slow way below
                log.warning("the cached empty store %s did not open (%s); making the schema anew", template, err)
                with contextlib.suppress(OSError):
                    template.unlink()
                template = None
    if template is None:
        scratch.unlink(missing_ok=True)  # a copy cut short or one that did not open
        _open(scratch)  # MLflow's migrations
    os.replace(scratch, db)
    for stale in db.parent.glob(f".{db.name}.new-*"):  # a killed creation's scratch file
        stale.unlink(missing_ok=True)


def forget_engine(uri: str) -> None:
    """Close MLflow's cached engine for `uri`: it keeps one per address, which would stay on a moved file."""
    engine = SqlAlchemyStore._engine_map.pop(uri, None)
    if engine is not None:
        engine.dispose()


def _open(db: Path) -> None:
    """Open `db` with MLflow (making its schema where it has none, and its Default experiment) and let it go."""
    uri = f"sqlite:///{db}"
    try:
        MlflowClient(tracking_uri=uri).search_experiments(max_results=1)
    finally:
        forget_engine(uri)


def empty_template() -> Path | None:
    """The cached empty store of this MLflow version, made now if it is missing; None where it cannot be made.
    (The tests seed each test's own cache with the one their session made.)"""
    template = cache_root() / "stores" / f"empty-mlflow-{mlflow.__version__}.db"
    if template.is_file():
        return template
    scratch = template.with_name(f".{template.name}.new-{os.getpid()}")
    try:
        template.parent.mkdir(parents=True, exist_ok=True)
        scratch.unlink(missing_ok=True)
        _open(scratch)
        with contextlib.closing(sqlite3.connect(scratch)) as con, con:
            con.execute("delete from experiment_tags")
            con.execute("delete from experiments")
        os.replace(scratch, template)  # two makers at once: each renames a whole file, the last one stays
    except (OSError, sqlite3.Error) as err:
        log.debug("no empty-store template in the cache (%s): this store's schema is made in place", err)
        with contextlib.suppress(OSError):
            scratch.unlink(missing_ok=True)
        return None
    return template
