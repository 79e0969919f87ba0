"""A command's start (src.common.startup): its imports made with the garbage collector paused, then frozen."""

import gc
import importlib

from src.common import startup


def test_the_collector_is_paused_while_a_command_imports_and_runs_again_after_on_what_is_new():
    was = gc.isenabled()
    try:
        gc.enable()
        importlib.reload(startup)  # a command's first line
        assert not gc.isenabled()
        made = [[] for _ in range(1000)]  # what the command's imports make
        startup.imported()
        assert gc.isenabled() and gc.get_freeze_count() >= len(made)
        assert not any(gc.is_tracked(x) and x in gc.get_objects() for x in made[:3])  # frozen: never walked again
        startup.imported()  # a second entry module's call changes nothing
        assert gc.isenabled()
        gc.disable()  # a process that had the collector off keeps it off
        importlib.reload(startup)
        startup.imported()
        assert not gc.isenabled()
    finally:  # what was frozen stays frozen, as in a command: only the collector's switch is put back
        (gc.enable if was else gc.disable)()
