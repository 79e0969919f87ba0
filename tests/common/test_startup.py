"""A command's start (src.common.startup): its imports made with the garbage collector paused, then frozen."""

import gc
import importlib
import subprocess
import sys

import pytest

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


@pytest.mark.parametrize(
    "sig, code, words", [("SIGINT", 130, "stopped by SIGINT (Ctrl-C)"), ("SIGTERM", 143, "stopped by SIGTERM")]
)
def test_a_read_back_command_stopped_mid_way_says_so_in_one_line(sig, code, words):
    """src.report, src.regress and src.sync run their main through startup.run: Ctrl-C there had printed a
    KeyboardInterrupt traceback, SIGTERM ended it without a word. A real process, sent a real signal."""
    program = (
        "import os, signal, sys, time\n"
        "signal.signal(signal.SIGINT, signal.default_int_handler)\n"
        "from src.common import startup\n"
        f"main = lambda argv: (os.kill(os.getpid(), signal.{sig}), time.sleep(5), 0)[-1]\n"
        "sys.exit(startup.run(main, []))\n"
    )
    ran = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True, timeout=60)
    assert ran.returncode == code and ran.stderr.strip() == f"quantspec: {words}", ran.stderr
