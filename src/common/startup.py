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

_was_enabled = gc.isenabled()
gc.disable()


def imported() -> None:
    """The command's imports are done: freeze what exists now and let the collector run again (if it ran before
    this module paused it) on what the command makes from here on. Idempotent: a second entry module imported
    by the first calls it too."""
    gc.freeze()
    if _was_enabled:
        gc.enable()
