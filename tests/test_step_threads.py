"""How the C++ step picks its thread count (src/kernels/step.cpp's Threads), driven with made-up step times:
it stays on all threads on a quiet host, moves to fewer within a few steps of a neighbour arriving, and comes
back within tens of steps of it leaving, trying the other counts ever more rarely while they keep losing."""

import pytest
import torch

from src import kernels
from tests.test_kernels import CACHE

KIND = 3  # one row through the head (step.cpp's key: 2 * rows + head)


@pytest.fixture(scope="module", autouse=True)
def binding():
    if not kernels.load(CACHE):
        pytest.fail(f"quantspec's kernels could not be built: {kernels.reason()}")


def drive(choice, steps: int, ms: dict[int, float], want: int = 2) -> list[int]:
    """`steps` calls, each taking ms[threads]; the counts chosen, in order."""
    chosen = []
    for _ in range(steps):
        t = choice.next(KIND, want)
        choice.record(KIND, t, ms[t] / 1e3)
        chosen.append(t)
    return chosen


def test_a_quiet_host_keeps_all_threads_and_tries_the_others_ever_more_rarely():
    choice = torch.classes.quantspec.Threads()
    chosen = drive(choice, 2000, {2: 10.0, 1: 22.0})
    assert chosen[:8] == [2] * 8  # all threads first
    tries = [i for i, t in enumerate(chosen) if t == 1]
    assert 3 <= len(tries) <= 12  # gaps doubling to 256: a few tries, not one every few steps
    assert tries[-1] - tries[-2] == 257  # the longest gap between tries on all threads
    counts = choice.counts()
    assert dict(zip(counts[::2], counts[1::2])) == {1: len(tries), 2: 2000 - len(tries)}


def test_a_neighbour_moves_the_step_to_fewer_threads_and_its_leaving_moves_it_back():
    choice = torch.classes.quantspec.Threads()
    drive(choice, 1000, {2: 10.0, 1: 22.0})  # settled on 2, its tries far apart
    busy = drive(choice, 200, {2: 50.0, 1: 24.0})  # a neighbour on one core: two threads wait at barriers
    assert busy.index(1) <= 12  # a step much slower than usual asks for a try at once
    assert busy[20:].count(2) <= 8  # on one thread, trying two every 32 steps at most
    quiet = drive(choice, 200, {2: 10.0, 1: 22.0})  # it left
    assert quiet.index(2) <= 33 and quiet[40:].count(1) <= 5  # tries again from 8 steps apart, doubling


def test_a_single_thread_has_nothing_to_choose():
    choice = torch.classes.quantspec.Threads()
    assert set(drive(choice, 50, {1: 5.0}, want=1)) == {1}


def test_more_cores_try_all_but_one_and_half():
    choice = torch.classes.quantspec.Threads()
    chosen = drive(choice, 300, {8: 10.0, 7: 6.0, 4: 9.0, 1: 40.0}, want=8)  # one of 8 cores busy
    assert set(chosen) == {8, 7, 4, 1} and chosen[-100:].count(7) >= 90
