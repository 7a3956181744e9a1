"""Give the allocator's free pages back to the system.

glibc keeps freed heap memory for reuse; after many large temporaries of varying sizes
(quantizing one layer after another) the process holds far more than it uses. Measured: quantizing
CogVideoX-2B while it loads ended at 3.98 GiB of anonymous memory for 1.59 GiB of weights without
a trim, 2.19 GiB with one after each layer (the same as with a fixed mmap threshold); streamed
conversion kept ~0.1 GB more per block without it.
"""

from __future__ import annotations

import ctypes
import functools


@functools.lru_cache(maxsize=1)
def _libc():
    try:
        return ctypes.CDLL("libc.so.6")
    except OSError:  # not glibc: nothing to trim
        return None


def trim() -> None:
    """``malloc_trim(0)`` where the C library is glibc; nothing elsewhere."""
    libc = _libc()
    if libc is not None and hasattr(libc, "malloc_trim"):
        libc.malloc_trim(0)
