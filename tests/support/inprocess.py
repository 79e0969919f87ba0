"""`python -m src.run ...` (or src.report, src.regress, src.sync) run in the test's own process.

A child process pays torch, transformers, MLflow and Hydra's imports (about 6 s on two cores) before its first
token; most tests of a command check what it says, returns and records, which the same code shows as well in
this process. The process is the point only for signals, kills, hangs, locks between processes, servers, the
sandbox and the browser: those tests start real ones (tests/e2e/).

What a run here must not leave behind for the next test, and is put back: the command line, the environment,
the signal handlers src.run installs, the logging Hydra configures for each job, Hydra's global state, and
the per-process record of job outcomes (src.tracking.sweep.record.ledger), and MLflow's stores, opened
afresh by each command as by a new process. Output is captured at the file
descriptors, so what a runtime's child process or a compiler prints is captured as it would be from a child.
"""

from __future__ import annotations

import contextlib
import importlib
import io
import logging
import os
import signal
import sys
import tempfile
from dataclasses import dataclass


@dataclass
class Ran:
    """What subprocess.run would have returned: the exit code and the two streams."""

    returncode: int
    stdout: str
    stderr: str


def _entry(module: str):
    """The function `python -m module` runs, and whether it takes argv (src.run reads sys.argv itself)."""
    if module == "src.run":
        from src import run

        return lambda argv: run.cli()
    if module == "src.report":
        from src.tracking.readback.reporting.cli import main
    elif module == "src.regress":
        from src.tracking.readback.regression.cli import main
    elif module == "src.sync":
        from src.tracking.store.sync import main
    else:
        raise ValueError(f"no in-process entry for {module}; start it as a process")
    return main


_streams: list = []  # the two text streams a command here writes through, made once (see _captured_fds)


def _text_streams() -> tuple[io.TextIOWrapper, io.TextIOWrapper]:
    """sys.stdout and sys.stderr for a command run here, over two file descriptors of their own that are pointed
    at each run's files and at /dev/null between runs. Never closed: something a command made may keep one (a
    log handler, a thread) and write to it later, which must not fail (nor reach a later run's output)."""
    if not _streams:
        null = os.open(os.devnull, os.O_WRONLY)
        for _ in range(2):
            fd = os.dup(null)
            _streams.append(
                io.TextIOWrapper(os.fdopen(fd, "wb"), encoding="utf-8", errors="replace", line_buffering=True)
            )
        os.close(null)
    return _streams[0], _streams[1]


@contextlib.contextmanager
def _captured_fds():
    """Files 1 and 2, and sys.stdout and sys.stderr over them, sent to temporary files; yields a function that
    reads them back. Everything is put back as it was, whatever the command did to sys.stdout or sys.stderr."""
    out_stream, err_stream = _text_streams()
    files = tempfile.TemporaryFile(mode="w+b"), tempfile.TemporaryFile(mode="w+b")
    saved_fds = os.dup(1), os.dup(2)
    saved_streams = sys.stdout, sys.stderr
    for s in saved_streams:
        with contextlib.suppress(Exception):
            s.flush()
    for f, fd, stream in zip(files, (1, 2), (out_stream, err_stream)):
        os.dup2(f.fileno(), fd)
        os.dup2(f.fileno(), stream.fileno())
    sys.stdout, sys.stderr = out_stream, err_stream

    def read() -> tuple[str, str]:
        texts = []
        for f, stream in zip(files, (out_stream, err_stream)):
            stream.flush()
            f.seek(0)
            texts.append(f.read().decode("utf-8", "replace"))
        return texts[0], texts[1]

    try:
        yield read
    finally:
        null = os.open(os.devnull, os.O_WRONLY)
        for stream in (out_stream, err_stream):
            with contextlib.suppress(Exception):
                stream.flush()
            os.dup2(null, stream.fileno())
        os.close(null)
        sys.stdout, sys.stderr = saved_streams
        os.dup2(saved_fds[0], 1)
        os.dup2(saved_fds[1], 2)
        for fd in saved_fds:
            os.close(fd)
        for f in files:
            f.close()


@contextlib.contextmanager
def _restored_process_state(argv: list[str], env: dict | None, cwd):
    """The command line, environment, working directory, signal handlers and logging as they were."""
    from hydra.core.global_hydra import GlobalHydra

    from src.common import signals
    from src.tracking.sweep import record

    saved_argv, saved_env, saved_cwd = sys.argv, dict(os.environ), os.getcwd()
    saved_signals = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGALRM)}
    saved_unraisable = sys.unraisablehook
    root = logging.getLogger()
    saved_root = root.handlers[:], root.level
    saved_loggers = {
        name: (lg.handlers[:], lg.level, lg.propagate, lg.disabled)
        for name, lg in logging.Logger.manager.loggerDict.items()
        if isinstance(lg, logging.Logger)
    }
    # Hydra configures logging for each job with dictConfig, which closes every handler this process has made
    # (logging._handlerList), the test runner's and a library's among them (absl's closes its stream: the
    # test runner's capture, made when it was imported). A new process has none of them; here they are hidden
    # from it for the run and put back after.
    saved_handler_list = logging._handlerList[:]
    logging._handlerList[:] = []
    # PYTHONPATH is read by a new interpreter into sys.path: here its folders join sys.path for the run, and what
    # was imported from them is forgotten after, as a new process would not have it either
    # (only folders not already on it: the project's own root is, and its modules stay)
    on_path = {os.path.realpath(p or ".") for p in sys.path}
    extra_paths = [
        p for p in (env or {}).get("PYTHONPATH", "").split(os.pathsep) if p and os.path.realpath(p) not in on_path
    ]
    saved_path = sys.path[:]
    sys.path[:0] = extra_paths
    importlib.invalidate_caches()
    sys.argv = argv
    os.environ.update(env or {})
    if cwd is not None:
        os.chdir(cwd)
    record.ledger = record.Ledger()  # one process's record of its sweep: a fresh one, as a new process has
    GlobalHydra.instance().clear()
    _forget_stores()
    try:
        yield
    finally:
        GlobalHydra.instance().clear()
        record.ledger = record.Ledger()
        signal.setitimer(signal.ITIMER_REAL, 0)
        for s, handler in saved_signals.items():
            signal.signal(s, handler)
        sys.unraisablehook = saved_unraisable
        signals._pending = signals._dropped_stop = None  # a stop this run received is its own
        signals._owed, signals._depth = False, 0
        os.chdir(saved_cwd)
        os.environ.clear()
        os.environ.update(saved_env)
        sys.argv = saved_argv
        sys.path[:] = saved_path
        for name, module in list(sys.modules.items()):
            where = getattr(module, "__file__", None) or ""
            if extra_paths and any(where.startswith(p.rstrip("/") + "/") for p in extra_paths):
                del sys.modules[name]
        for h in root.handlers[:]:
            if h not in saved_root[0]:
                root.removeHandler(h)
                with contextlib.suppress(Exception):
                    h.close()
        root.handlers[:] = saved_root[0]
        logging._handlerList[:] = saved_handler_list + logging._handlerList
        root.setLevel(saved_root[1])
        for name, lg in logging.Logger.manager.loggerDict.items():
            if not isinstance(lg, logging.Logger):
                continue
            if name in saved_loggers:
                lg.handlers[:], lg.level, lg.propagate, lg.disabled = saved_loggers[name]
            else:
                lg.handlers[:] = []


def _forget_stores() -> None:
    """MLflow keeps one store object (and one database engine) per address for the life of a process; a new
    process opens each store afresh, and checks its schema then. So does a command run here."""
    from mlflow.store.tracking.sqlalchemy_store import SqlAlchemyStore
    from mlflow.tracking._tracking_service import utils

    utils._tracking_store_registry._get_store_with_resolved_uri.cache_clear()
    for uri in list(SqlAlchemyStore._engine_map):
        SqlAlchemyStore._engine_map.pop(uri).dispose()


def run_in_process(args: list[str], module: str = "src.run", env: dict | None = None, cwd=None) -> Ran:
    """`python -m module *args` with `env` added to the environment, run here: its exit code (a SystemExit's, 0
    when it returns None) and what it printed."""
    main = _entry(module)
    code = 0
    with _restored_process_state([f"{module.replace('.', '/')}.py", *args], env, cwd), _captured_fds() as read:
        try:
            returned = main(list(args))
            code = returned if isinstance(returned, int) else 0
        except SystemExit as done:
            code = done.code if isinstance(done.code, int) else (0 if done.code is None else 1)
            if not isinstance(done.code, int | None):
                print(done.code, file=sys.stderr)
        stdout, stderr = read()
    return Ran(code, stdout, stderr)
