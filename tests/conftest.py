"""The fixtures every room shares (what they are built from: tests/support/), the tests' own environment (set
here, before any test module imports src), and how the suite shares the host: one pytest-xdist worker per core
(pyproject.toml's addopts), each held to its own cores, and a test marked `alone` (it measures the host's load or
one speed against another) run with no other test beside it, on all the cores."""

from __future__ import annotations

import contextlib
import fcntl
import gc
import os
import sys
from pathlib import Path

import pytest

# Tests never reach a hub: fail fast instead of waiting on timeouts.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
# No busy round is measured again unless a test asks (busy_reruns=N on its command line): a test's counts of
# jobs and rounds must not follow the host's load. Every process a test starts inherits it.
os.environ.setdefault("QUANTSPEC_BUSY_RERUNS", "0")


def pytest_configure(config):
    worker = getattr(config, "workerinput", None)
    if worker is not None and worker["workercount"] > 1 and hasattr(os, "sched_setaffinity"):
        # Each worker on cores of its own, and its jobs see only those (src.assembly.hardware counts the affinity):
        # two workers' torch thread pools on the same two cores spin against each other, and a test ran 2-5x
        # slower than alone (tests/engine/test_speculative.py, measured); one per core, they only share memory.
        cores = sorted(os.sched_getaffinity(0))
        index, count = int(worker["workerid"].removeprefix("gw")), worker["workercount"]
        config.quantspec_cores = (set(cores), set(cores[index::count]) or {cores[index % len(cores)]})
        _hold_to(config.quantspec_cores[1])
    config.addinivalue_line(
        "markers",
        "alone: the test measures the host's load or one speed against another, so no other test runs beside it "
        "(the other workers wait at their next test until it ends)",
    )


def pytest_collection_finish(session):
    """What the collection imported (torch, transformers, MLflow, every test module) lives to the end: frozen out
    of the collections a job makes before it starts (src.assembly.memory.release_freed), as src.run does for
    its own process (src.common.startup)."""
    gc.collect()
    gc.freeze()
    if hasattr(session.config, "quantspec_cores"):  # torch's pool may have sized itself before the worker was held
        _hold_to(session.config.quantspec_cores[1])


@pytest.hookimpl(tryfirst=True)  # before pytest-xdist reads the marks
def pytest_collection_modifyitems(config, items):
    """A module's tests that share one of its module-scoped fixtures (a sweep they all read, a Ray cluster, a
    tracking server) go to one worker, which builds it once: pytest-xdist's loadgroup reads this mark. The
    `alone` tests go first, all to one worker, one after another: it holds the host once for all of them (the
    other worker waits at its first test), instead of each one, met mid-run, waiting for the other worker's
    current test to end (up to a minute and a half, one core idle) and then running with the other core idle."""
    groups: dict[str, list] = {}
    for item in items:
        defs = getattr(item, "_fixtureinfo", None)
        shared = defs and any(fixture[-1].scope == "module" for fixture in defs.name2fixturedefs.values() if fixture)
        if shared and item.get_closest_marker("xdist_group") is None:
            item.add_marker(pytest.mark.xdist_group(item.module.__name__))
        mark = item.get_closest_marker("xdist_group")
        groups.setdefault(mark.args[0] if mark else item.nodeid, []).append(item)
    # a group whose every test is alone (a module's tests of one timed sweep) joins the alone tests' group
    first = [item for group in groups.values() if all(_alone(item) for item in group) for item in group]
    for item in first:
        item.own_markers = [m for m in item.own_markers if m.name != "xdist_group"]
        item.add_marker(pytest.mark.xdist_group("alone"))
    chosen = set(map(id, first))
    items[:] = first + [item for item in items if id(item) not in chosen]


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item, nextitem):
    alone = _alone(item)
    with _turn(item.config, alone, keep=alone and nextitem is not None and _alone(nextitem)):
        return (yield)


def _alone(item) -> bool:
    return item.get_closest_marker("alone") is not None


class _Machine:
    """The host as an `alone` test holds it (its turn's open lock files), kept through the alone tests that follow
    it on this worker (a module's tests that read one timed sweep): released between them, the other workers would
    start a test each, and the next alone test would wait for the longest of them to end."""

    held: contextlib.ExitStack | None = None

    def release(self) -> None:
        if self.held is not None:
            self.held.close()
            self.held = None


_machine = _Machine()


@contextlib.contextmanager
def _turn(config, alone: bool, keep: bool = False):
    """A test's turn among the workers (a readers-writer lock on two files the run's workers share): any number
    of tests at once, or one `alone` test with none beside it. An `alone` test holds the gate while it waits for
    the others to finish their current tests, so no new one starts and it is not starved. No lock without
    workers: one process runs one test at a time. `keep`: an alone test's turn is not given back at its end but
    kept (_machine) until the last alone test of a run of them on this worker ends."""
    if not hasattr(config, "workerinput"):  # not an xdist worker
        yield
        return
    if not alone:
        with _take_turn(config, alone=False):
            yield
        return
    if _machine.held is None:  # else the alone test before this one kept its turn
        _machine.held = _take_turn(config, alone=True)
    try:
        yield
    finally:
        if not keep:
            _machine.release()


def _take_turn(config, alone: bool) -> contextlib.ExitStack:
    """The turn's locks taken (for an alone test, the host's every core too), as what gives them back."""
    shared = Path(config.option.basetemp).parent  # the run's own folder: workers' basetemps are popen-gwN in it
    turn = contextlib.ExitStack()
    gate = turn.enter_context(open(shared / "turns.gate", "a"))  # closing the files releases the locks
    room = turn.enter_context(open(shared / "turns.room", "a"))
    fcntl.flock(gate, fcntl.LOCK_EX)
    fcntl.flock(room, fcntl.LOCK_EX if alone else fcntl.LOCK_SH)
    if not alone:
        fcntl.flock(gate, fcntl.LOCK_UN)
        return turn
    cores = getattr(config, "quantspec_cores", None)  # None: one worker, never held to fewer cores
    if cores is not None:
        every, own = cores
        _hold_to(every)  # alone: the whole host, as a user's job would have it
        turn.callback(_hold_to, own)  # runs first when the turn is given back: then the locks
    return turn


def _hold_to(cores: set[int]) -> None:
    """This process, every thread of it (torch's pool too: a thread keeps the affinity it started with), on
    `cores`, and torch's pool sized to them; the processes it starts from now on inherit them."""
    for task in os.listdir("/proc/self/task"):
        with contextlib.suppress(OSError):  # a thread that ended meanwhile
            os.sched_setaffinity(int(task), cores)
    torch = sys.modules.get("torch")
    if torch is not None:
        torch.set_num_threads(len(cores))


@pytest.fixture
def store(tmp_path) -> str:
    """A throwaway MLflow store of the test's own."""
    return f"sqlite:///{tmp_path / 'mlflow.db'}"
