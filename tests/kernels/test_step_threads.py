"""How the C++ step picks its thread count (src/kernels/step.cpp's Threads), driven with made-up step times and
barrier waits: it stays on all threads on a quiet host, trying another count once in 1024 steps; moves to fewer
within a few steps of a neighbour arriving (its threads then wait at barriers, and its steps slow); tries ever
more rarely where fewer threads are no faster; and comes back within ~32 steps of the neighbour leaving."""

import pytest
import torch

from src import kernels
from tests.support.kernels import KERNELS as CACHE

KIND = 3  # one row through the head (step.cpp's key: 2 * rows + head)
QUIET = {2: (10.0, 0.007), 1: (22.0, 0.0)}  # ms a step, share of it waiting at barriers: measured shapes
BUSY = {2: (50.0, 0.2), 1: (24.0, 0.0)}  # a neighbour on one core, barriers that spin


@pytest.fixture(scope="module", autouse=True)
def binding():
    if not kernels.load(CACHE):
        pytest.fail(f"quantspec's kernels could not be built: {kernels.reason()}")


def drive(choice, steps: int, host: dict[int, tuple[float, float]], want: int = 2) -> list[int]:
    """`steps` calls, each taking host[threads] (ms, waiting share); the counts chosen, in order."""
    chosen = []
    for _ in range(steps):
        t = choice.next(KIND, want)
        ms, waiting = host[t]
        choice.record(KIND, t, ms / 1e3, waiting)
        chosen.append(t)
    return chosen


def test_a_quiet_host_keeps_all_threads_and_tries_another_count_once_in_1024_steps():
    choice = torch.classes.quantspec.Threads()
    chosen = drive(choice, 2100, QUIET)
    assert [i for i, t in enumerate(chosen) if t == 1] == [1024, 2049]
    counts = choice.counts()
    assert dict(zip(counts[::2], counts[1::2])) == {1: 2, 2: 2098}


def test_a_neighbour_moves_the_step_to_fewer_threads_and_its_leaving_moves_it_back():
    choice = torch.classes.quantspec.Threads()
    drive(choice, 100, QUIET)
    busy = drive(choice, 200, BUSY)
    assert busy.index(1) <= 3 and busy[10:].count(2) <= 8  # then trying two threads every 32 steps at most
    quiet = drive(choice, 200, QUIET)  # it left
    assert quiet.index(2) <= 33 and quiet[40:].count(1) == 0


def test_barrier_waits_alone_ask_for_a_try():
    choice = torch.classes.quantspec.Threads()
    drive(choice, 100, QUIET)
    stalled = drive(choice, 100, {2: (10.5, 0.15), 1: (8.0, 0.0)})  # no slower, but waiting: one thread wins
    assert stalled.index(1) <= 6 and stalled[10:].count(1) >= 85


def test_where_fewer_threads_are_no_faster_the_tries_grow_rare():
    choice = torch.classes.quantspec.Threads()
    chosen = drive(choice, 1000, {2: (26.0, 0.2), 1: (26.0, 0.0)})  # waits, but one thread is no better
    tries = [i for i, t in enumerate(chosen) if t == 1]
    assert 4 <= len(tries) <= 10 and tries[-1] - tries[-2] >= 200


def test_a_single_thread_has_nothing_to_choose():
    choice = torch.classes.quantspec.Threads()
    assert set(drive(choice, 50, {1: (5.0, 0.0)}, want=1)) == {1}


def test_more_cores_try_all_but_one_and_half():
    choice = torch.classes.quantspec.Threads()
    host = {8: (10.0, 0.2), 7: (6.0, 0.01), 4: (9.0, 0.0), 1: (40.0, 0.0)}  # one of 8 cores busy
    chosen = drive(choice, 300, host, want=8)
    assert {8, 7, 4, 1} == set(chosen) and chosen[-100:].count(7) >= 90
