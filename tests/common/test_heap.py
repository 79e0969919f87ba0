"""The C heap kept for reuse (src/common/heap.py: retained): a large temporary made again inside reuses the freed
one's pages, where outside glibc maps it afresh and the kernel faults in (and zeroes) every page again; after,
glibc's defaults are back.

Measured in a fresh interpreter: what a heap does depends on what the process did before (in a test worker that had
run 260 other tests, the fresh-clone CI's lowest-versions run, the temporary was mapped afresh inside too)."""

import json
import subprocess
import sys

from src.common.environment import PROJECT_ROOT

PROGRAM = """
import json, resource
import torch
from src.common import heap

MB64 = 16 * 1024 * 1024  # float32 elements: 64 MB, past glibc's largest mmap threshold (32 MB)

def faults_of_a_second_temporary():
    # after a larger one was freed (one the same size may not fit where it was: torch asks glibc for aligned
    # memory, which takes a little more)
    first = torch.ones(2 * MB64)
    del first
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    second = torch.ones(MB64)
    faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before
    del second
    return faults

outside = faults_of_a_second_temporary()
with heap.retained():
    inside = faults_of_a_second_temporary()
after = faults_of_a_second_temporary()
print(json.dumps([outside, inside, after]))
"""


def test_a_freed_temporary_is_reused_inside_and_mapped_afresh_outside():
    ran = subprocess.run([sys.executable, "-c", PROGRAM], capture_output=True, text=True, timeout=120, cwd=PROJECT_ROOT)
    assert ran.returncode == 0, ran.stderr[-2000:]
    outside, inside, after = json.loads(ran.stdout.strip().splitlines()[-1])
    # mapped afresh: a fault a page (4 KB; 2 MB where transparent huge pages serve it), none for pages reused
    assert outside >= 16, outside
    assert inside * 10 < outside, (inside, outside)
    assert after * 2 > outside, (after, outside)  # the defaults restored
