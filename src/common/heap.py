"""The C heap's free pages handed back to the OS (glibc's malloc_trim), where a process has just freed much.

glibc keeps freed memory for reuse, and the OS counts it as the process's: a model whose tensors are copied into
new ones (fused, repacked) and the old ones freed holds both, as far as its peak resident memory says, until
the heap is trimmed. And the other way: memory kept for reuse where large temporaries come and go (`retained`).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
from collections.abc import Iterator
from contextlib import contextmanager

# mallopt's parameters (malloc.h) and glibc's defaults for them; MMAP_THRESHOLD_MAX: the most glibc's own mmap
# threshold climbs to on 64 bits (it rises to each mapped chunk freed, up to this)
M_TRIM_THRESHOLD, M_MMAP_THRESHOLD, M_MMAP_MAX = -1, -3, -4
DEFAULT_TRIM_THRESHOLD, DEFAULT_MMAP_MAX, MMAP_THRESHOLD_MAX = 128 * 1024, 65536, 32 * 1024 * 1024


@functools.cache
def _libc_function(name: str):
    libc = ctypes.util.find_library("c")
    try:
        return getattr(ctypes.CDLL(libc), name) if libc else None
    except (OSError, AttributeError):  # not glibc: nothing to tune this way
        return None


def trim() -> None:
    """Return the heap's free pages to the OS (a no-op off glibc)."""
    fn = _libc_function("malloc_trim")
    if fn is not None:
        fn(0)


@contextmanager
def retained() -> Iterator[None]:
    """Freed memory kept for reuse inside: every allocation from the heap (none mmapped apart) and none of it handed
    back, until the end, where glibc's defaults return and the heap is trimmed.

    For work that frees and makes again many large temporaries (quantizing layer after layer): glibc maps each one
    over 32 MB afresh and unmaps it when freed, so the kernel zeroes its pages again at the next (a 7B layer's
    rounding made ~16 GB of such pages, ~15% of its CPU time spent clearing them). Kept, a temporary reuses the
    pages of the last one its size; the peak is what is alive at once plus what fragmentation strands, so a long
    run calls trim() between its parts (trim hands back every free page, wherever it lies)."""
    mallopt = _libc_function("mallopt")
    if mallopt is None:
        yield
        return
    mallopt(M_MMAP_MAX, 0)
    mallopt(M_TRIM_THRESHOLD, 2**31 - 1)
    try:
        yield
    finally:
        mallopt(M_MMAP_MAX, DEFAULT_MMAP_MAX)
        mallopt(M_TRIM_THRESHOLD, DEFAULT_TRIM_THRESHOLD)
        # setting either one above fixed glibc's mmap threshold where it stood (no mallopt reads it back): set it
        # where glibc's own rises to after large frees, or every temporary from 128 KB up is mapped afresh after
        mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD_MAX)
        trim()
