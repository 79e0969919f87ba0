"""A stop signal that lands where Python drops exceptions (a weakref callback, a finalizer, a garbage collection)
still stops: the fifth round of faults saw SIGTERM printed as "Exception ignored in: ...WeakValueDictionary...
Stopped: SIGTERM" and the sweep go on. Each case is a real process sent a real signal while it runs such a
callback (the process is what is tested)."""

import subprocess
import sys
import textwrap

import pytest

from src.common import signals

PROGRAM = textwrap.dedent(
    """
    import gc, os, signal, sys, time, weakref
    from src.common import signals

    signals.install()

    class Held:
        def __del__(self):
            if WHERE == "finalizer":
                os.kill(os.getpid(), SIG)
                spin()

    def spin():  # the handler runs here, inside the callback, at the interpreter's next check
        end = time.time() + 0.2
        while time.time() < end:
            pass

    def landed(ref):
        os.kill(os.getpid(), SIG)
        spin()

    try:
        held = Held()
        ref = weakref.ref(held, landed if WHERE == "weakref" else None)
        del held
        gc.collect()
        for _ in range(200):  # the sweep's loop going on: a stop must end it
            time.sleep(0.01)
        print("went on")
    except (signals.Stopped, KeyboardInterrupt) as err:
        print("stopped", type(err).__name__)
        sys.exit(3)
    """
)


@pytest.mark.parametrize("where", ["weakref", "finalizer"])
@pytest.mark.parametrize("sig", ["SIGTERM", "SIGINT"])
def test_a_stop_dropped_inside_a_callback_still_stops_the_process(where, sig):
    # Ctrl-C as a terminal delivers it: a test runner's worker may start its children with SIGINT ignored
    head = f"WHERE = {where!r}\nSIG = signal.{sig}\nimport signal\nsignal.signal(signal.SIGINT, signal.default_int_handler)\n"
    program = PROGRAM.replace("signals.install()", head + "signals.install()", 1)
    ran = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True, timeout=60)
    assert ran.returncode == 3, ran.stdout + ran.stderr
    assert ran.stdout.startswith("stopped") and "went on" not in ran.stdout


def test_a_stop_left_pending_is_raised_at_the_next_check():
    saved = signals._pending
    try:
        signals._pending = None
        signals.check()  # nothing asked for: nothing raised
        signals._pending = 15
        with pytest.raises(signals.Stopped, match="SIGTERM"):
            signals.check()
    finally:
        signals._pending = saved


@pytest.mark.parametrize("module", ["src.sync", "src.report", "src.regress", "src.run"])
def test_a_reader_that_leaves_the_pipe_gets_no_traceback(module):
    """`python -m src.sync --help | head -1` had printed a BrokenPipeError traceback: the reader here leaves before
    the command writes (the process, its pipe and its exit code are what is tested)."""
    ran = subprocess.run(
        f"{sys.executable} -m {module} --help | true", shell=True, capture_output=True, text=True, timeout=120
    )
    assert "Traceback" not in ran.stderr and "BrokenPipe" not in ran.stderr, ran.stderr


DEFERRED = textwrap.dedent(
    """
    import os, signal, sys, time
    from src.common import signals

    signal.signal(signal.SIGINT, signal.default_int_handler)
    signals.install()
    steps = []
    try:
        with signals.deferred():
            os.kill(os.getpid(), SIG)
            time.sleep(0.05)  # the handler has run by now: it must not have raised
            steps.append("write finished")
            if TWICE:
                os.kill(os.getpid(), SIG)
                time.sleep(0.05)
                steps.append("second write finished")
        steps.append("went on")
    except (signals.Stopped, KeyboardInterrupt) as err:
        print(",".join(steps), type(err).__name__)
        sys.exit(3)
    """
)


@pytest.mark.parametrize("sig, raised", [("SIGTERM", "Stopped"), ("SIGINT", "KeyboardInterrupt")])
@pytest.mark.parametrize("twice", [False, True])
def test_a_stop_inside_a_write_is_raised_when_the_write_ends_and_a_second_at_once(sig, raised, twice):
    """A stop raised inside an MLflow call had left SQLite's write lock held: the runs' closing calls then failed
    on "database is locked" and stayed RUNNING. Inside `deferred()` the write finishes first; a second stop there
    is not held back (a hung write must not hold the process)."""
    program = f"SIG = {sig!r}\nTWICE = {twice}\nimport signal\nSIG = getattr(signal, SIG)\n" + DEFERRED
    ran = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True, timeout=60)
    assert ran.returncode == 3, ran.stdout + ran.stderr
    assert ran.stdout.strip() == f"write finished {raised}", ran.stdout
