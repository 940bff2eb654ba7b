"""Give the C allocator's free memory back to the operating system.

Upload buffers are large and of many sizes: whole small files, full parts and the short
last part of every file. glibc keeps the free space between the buffers still in use
resident, so on a folder of mixed sizes the daemon held about 30 MB more than on a folder
of equal files: 164.6 MB against 133.8 MB for 10 GiB on S3 (bench/memory.md).

Contract of :func:`give_back_free_memory`: on glibc it asks ``malloc_trim(0)`` to release
the pages of free heap memory in every arena; memory in use is never touched. Anywhere else
(musl, macOS) it does nothing. It never raises. Pages given back fault in again when the
allocator reuses them (0.1-0.2 CPU-s/GB on S3 when done after every file), so callers
should give back only when resident memory is high: :func:`resident_bytes` tells.
"""

from __future__ import annotations

import ctypes
import os
from collections.abc import Callable

__all__ = ["give_back_free_memory", "resident_bytes"]

_PAGE_BYTES = os.sysconf("SC_PAGE_SIZE")


def _malloc_trim() -> Callable[[int], int] | None:
    try:
        fn = ctypes.CDLL(None).malloc_trim  # the C library this process runs on
    except (OSError, AttributeError):
        return None
    fn.argtypes = [ctypes.c_size_t]
    fn.restype = ctypes.c_int
    return fn


_TRIM = _malloc_trim()


def give_back_free_memory() -> bool:
    """Release free heap pages to the OS; ``False`` where the C library cannot (not glibc)."""
    if _TRIM is None:
        return False
    _TRIM(0)
    return True


def resident_bytes() -> int | None:
    """This process's resident memory now, from ``/proc/self/statm``; ``None`` without /proc."""
    try:
        with open("/proc/self/statm", "rb") as f:
            return int(f.read().split()[1]) * _PAGE_BYTES
    except (OSError, ValueError, IndexError):
        return None
