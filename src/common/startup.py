"""A command's start: the garbage collector paused while the process imports its stack (torch, transformers,
MLflow, Hydra), and what the imports made frozen out of every later collection.

Why, measured on a 2-core AMD EPYC (`python -c "import src.run"`, three runs each): 17-19 s with the collector
running, 11-13 s paused and frozen. The imports make millions of objects that live until exit (modules, classes,
functions), and each full collection walked them all: during the imports, at every collection a sweep makes
before a job (src.assembly.memory.release_freed: 0.8 s each), and at the interpreter's teardown (~3 s). A frozen
object is never walked again; what the command makes after its imports is collected as before.

An entry module imports this first (its own import block, before the heavy ones) and calls `imported()` after
its last import. While the imports load (seconds), a stop (SIGINT, SIGTERM, SIGHUP) ends the command in one line
(Ctrl-C had printed a KeyboardInterrupt traceback from deep in torch's imports): nothing is recorded yet, so
nothing needs closing. Only where a quantspec command is the process's main module (`python -m src.run`): a
test runner importing it keeps its own handlers."""

import gc
import os
import signal
import sys

from src.common import signals
from src.common.say import say

ENTRY = ("src.run", "src.serve", "src.sync", "src.report", "src.regress")
STOPS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)

_was_enabled = gc.isenabled()
gc.disable()


def _stopped_while_starting(signum, frame):
    name = "SIGINT (Ctrl-C)" if signum == signal.SIGINT else signal.Signals(signum).name
    say(f"stopped by {name} while starting; nothing was recorded", err=True)
    os._exit(128 + signum)


_main = getattr(sys.modules.get("__main__"), "__spec__", None)
_early = getattr(_main, "name", None) in ENTRY
if _early:  # a signal the command was started ignoring (a shell's `&` job and SIGINT) stays ignored
    _before = {sig: signal.getsignal(sig) for sig in STOPS}
    for sig in STOPS:
        if _before[sig] is not signal.SIG_IGN:
            signal.signal(sig, _stopped_while_starting)


def imported() -> None:
    """The command's imports are done: freeze what exists now and let the collector run again (if it ran before
    this module paused it) on what the command makes from here on. Idempotent: a second entry module imported
    by the first calls it too."""
    global _early
    gc.freeze()
    if _was_enabled:
        gc.enable()
    if _early:  # the command's own handling from here (src.common.signals for a sweep; Python's for the rest)
        _early = False
        for sig, handler in _before.items():
            signal.signal(sig, handler)


def detach_stdin() -> None:
    """Point the process's standard input (fd 0, and so every child's) at /dev/null: a job reads nothing from it,
    and a library that asks a question there (transformers' "run the custom code? [y/N]") gets end-of-file, not
    an answer piped into a sweep or typed at a terminal. Only where a quantspec command is the process's main
    module: a test runner calling the command in process keeps its own."""
    if getattr(_main, "name", None) not in ENTRY:
        return
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.close(null)
    sys.stdin = open(0, closefd=False)  # noqa: SIM115 - fd 0 lives as long as the process


def run(main, argv: list[str]) -> int:
    """The command's exit code: main's; 128 + the signal where a stop ended it, said in one line (its store writes
    finish first: src.common.signals); or 141 (128 + SIGPIPE, as a shell reports a writer its reader left) where
    the reader of its output went away (`| head -1`): nothing more can be said there, so nothing is, and the
    interpreter's own flush at exit is pointed at /dev/null instead of printing a traceback."""
    signals.install()
    try:
        code = main(argv)
        sys.stdout.flush()
    except BrokenPipeError:
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 128 + signal.SIGPIPE
    except (KeyboardInterrupt, signals.Stopped) as err:
        signals.stopping()
        reason, code = signals.describe(err)
        say(reason, err=True)
    signals.stopping()  # done: a stop during the interpreter's teardown is ignored, not a death by signal
    return code
