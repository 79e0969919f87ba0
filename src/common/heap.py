"""The C heap's free pages handed back to the OS (glibc's malloc_trim), where a process has just freed much.

glibc keeps freed memory for reuse, and the OS counts it as the process's: a model whose tensors are copied into
new ones (fused, repacked) and the old ones freed holds both, as far as its peak resident memory says, until
the heap is trimmed.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools


@functools.cache
def _malloc_trim():
    libc = ctypes.util.find_library("c")
    try:
        return ctypes.CDLL(libc).malloc_trim if libc else None
    except (OSError, AttributeError):  # not glibc: nothing to trim this way
        return None


def trim() -> None:
    """Return the heap's free pages to the OS (a no-op off glibc)."""
    fn = _malloc_trim()
    if fn is not None:
        fn(0)
