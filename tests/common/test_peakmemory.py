"""A job's peak memory (src.common.peakmemory): its own, exact, and its children's, which another runtime's
process holds (the model's weights are in the child): each a real process holding real memory."""

import subprocess
import sys
import time

from src.common import peakmemory

HOLD = "import sys, time; block = bytearray({mb} * 2**20); print('held', flush=True); time.sleep({s})"


def test_the_own_peak_counts_from_its_reset():
    peakmemory.reset_own()
    before = peakmemory.own_gb()
    block = bytearray(300 * 2**20)  # touched: resident
    assert peakmemory.own_gb() - before > 0.25
    del block


def test_a_child_s_memory_is_the_job_s_too_even_after_the_child_has_ended():
    """Before, peak_rss_gb was the job's own process alone: an OpenVINO job's row said nothing of its child."""
    with peakmemory.Peak(period_s=0.05) as peak:
        child = subprocess.Popen([sys.executable, "-c", HOLD.format(mb=300, s=1.0)], stdout=subprocess.PIPE, text=True)
        assert child.stdout.readline().strip() == "held"
        time.sleep(0.3)  # read at least once while it holds its block
        child.wait(timeout=30)
    figures = peak.figures()
    assert figures["peak_rss_children_gb"] > 0.28, figures
    assert figures["peak_rss_gb"] == figures["peak_rss_own_gb"] + figures["peak_rss_children_gb"]
    assert figures["peak_rss_own_gb"] < figures["peak_rss_gb"]


def test_children_that_never_lived_together_are_not_summed():
    """A code task's completions run one after another: the largest of them, not their sum."""
    with peakmemory.Peak(period_s=0.05) as peak:
        for _ in range(3):
            child = subprocess.Popen(
                [sys.executable, "-c", HOLD.format(mb=200, s=0.4)], stdout=subprocess.PIPE, text=True
            )
            assert child.stdout.readline().strip() == "held"
            child.wait(timeout=30)
    children = peak.figures()["peak_rss_children_gb"]
    assert 0.18 < children < 0.4, children
