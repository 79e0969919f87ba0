"""A model's weights moved onto 2 MB pages (Linux transparent huge pages), before anything is timed.

A decode step streams every weight once; on 4 KB pages that is a TLB miss, and a stop of the hardware
prefetcher, every 4 KB. Gemma 3's int8 head (168 MB) read at 67 GB/s on 4 KB pages and 76 on 2 MB pages,
a float32 weight of the same size 73 and 77 (2 cores of an AVX-512 EPYC, the same weights, in turns).
torch allocates large tensors with mmap on 4 KB pages, and under the `madvise` policy (this host's) the
kernel gives huge pages only to memory that asks, so each large weight asks (MADV_HUGEPAGE) and has its
pages collapsed into huge ones now (MADV_COLLAPSE, Linux 6.1+), rather than whenever
khugepaged gets to them. Weights mapped in place from a file (fp32 read from the cache's safetensors)
cannot be collapsed, and are said so.
"""

from __future__ import annotations

import ctypes
import errno
import os
import sys

import torch
from torch import nn

HUGE = 2 << 20  # x86-64's and arm64's (4 KB granule) transparent huge page
MADV_HUGEPAGE, MADV_COLLAPSE = 14, 25  # linux/mman.h, the same on every architecture
MIN_BYTES = 2 * HUGE  # smaller tensors hold no whole aligned huge page, or hardly one


def _madvise():
    libc = ctypes.CDLL(None, use_errno=True)
    fn = libc.madvise
    fn.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    fn.restype = ctypes.c_int
    return fn


def _weights(model: nn.Module) -> list[torch.Tensor]:
    """The model's large CPU tensors, each storage once (a tied head is the embedding)."""
    seen, out = set(), []
    for t in (*model.parameters(), *model.buffers()):
        if t.device.type != "cpu" or t.numel() * t.element_size() < MIN_BYTES:
            continue
        if t.data_ptr() not in seen:
            seen.add(t.data_ptr())
            out.append(t)
    return out


def back_with_huge_pages(model: nn.Module) -> str:
    """Ask for huge pages under the model's large weights and collapse them now; what happened, in words
    (logged as param executed.huge_pages)."""
    tensors = _weights(model)
    total = sum(t.numel() * t.element_size() for t in tensors)
    if not tensors:
        return "none: no weight of 4 MB or more"
    if not sys.platform.startswith("linux"):
        return f"no: {sys.platform} has no transparent huge pages"
    madvise = _madvise()
    collapsed = advised = 0
    failure = ""
    for t in tensors:
        start = t.data_ptr()
        # the whole huge pages inside the tensor: advice on a partial page would reach its neighbours
        a = -(-start // HUGE) * HUGE
        b = (start + t.numel() * t.element_size()) // HUGE * HUGE
        if b <= a:
            continue
        if madvise(a, b - a, MADV_HUGEPAGE) != 0:
            return f"no: madvise(MADV_HUGEPAGE) failed ({os.strerror(ctypes.get_errno())}; is {_policy()}?)"
        advised += b - a
        if madvise(a, b - a, MADV_COLLAPSE) == 0:
            collapsed += b - a
        elif not failure:
            err = ctypes.get_errno()
            failure = (
                "weights mapped from a file (the cache's safetensors, read in place), or a kernel before Linux 6.1"
                if err == errno.EINVAL
                else f"MADV_COLLAPSE: {os.strerror(err)}"
            )
    said = f"{collapsed / 2**20:.0f} of {total / 2**20:.0f} MB of weights on 2 MB pages"
    if collapsed < advised:
        said += f" ({(advised - collapsed) / 2**20:.0f} MB could not be: {failure})"
    return said


def _policy() -> str:
    try:
        with open("/sys/kernel/mm/transparent_hugepage/enabled") as f:
            return f"transparent_hugepage '{f.read().strip()}'"
    except OSError:
        return "transparent_hugepage off in this kernel"


def huge_page_bytes(t: torch.Tensor) -> int:
    """Bytes of the mappings over t's data that the kernel backs with huge pages (/proc/self/smaps's
    AnonHugePages; advice splits a mapping, so every piece that overlaps t counts): what a test checks
    the collapse against."""
    lo_t = t.data_ptr()
    hi_t = lo_t + t.numel() * t.element_size()
    total, inside = 0, False
    with open("/proc/self/smaps") as f:
        for line in f:
            head = line.split(None, 1)[0]
            if "-" in head and not head.endswith(":"):  # a mapping's first line: its address range
                lo, hi = (int(x, 16) for x in head.split("-"))
                inside = lo < hi_t and lo_t < hi
            elif inside and head == "AnonHugePages:":
                total += int(line.split()[1]) * 1024
    return total
