"""A command's start: the garbage collector paused while the process imports its stack (torch, transformers,
MLflow, Hydra), and what the imports made frozen out of every later collection.

Why, measured on a 2-core AMD EPYC (`python -c "import src.run"`, three runs each): 17-19 s with the collector
running, 11-13 s paused and frozen. The imports make millions of objects that live until exit (modules, classes,
functions), and each full collection walked them all: during the imports, at every collection a sweep makes
before a job (src.assembly.memory.release_freed: 0.8 s each), and at the interpreter's teardown (~3 s). A frozen
object is never walked again; what the command makes after its imports is collected as before.

An entry module imports this first (its own import block, before the heavy ones) and calls `imported()` after
its last import."""

import gc
import os
import signal
import sys

_was_enabled = gc.isenabled()
gc.disable()


def imported() -> None:
    """The command's imports are done: freeze what exists now and let the collector run again (if it ran before
    this module paused it) on what the command makes from here on. Idempotent: a second entry module imported
    by the first calls it too."""
    gc.freeze()
    if _was_enabled:
        gc.enable()


def run(main, argv: list[str]) -> int:
    """The command's exit code: main's, or 141 (128 + SIGPIPE, as a shell reports a writer its reader left) where
    the reader of its output went away (`| head -1`): nothing more can be said there, so nothing is, and the
    interpreter's own flush at exit is pointed at /dev/null instead of printing a traceback."""
    try:
        code = main(argv)
        sys.stdout.flush()
    except BrokenPipeError:
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 128 + signal.SIGPIPE
    return code
