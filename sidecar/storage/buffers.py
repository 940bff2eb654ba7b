"""Part buffers that one backend's uploads read into and hand on, reused instead of
allocated per part.

A fresh buffer of a part's size costs the kernel a page fault and a zeroed page for every
4 KiB the file is read into, and a CRC32C taken after the whole part was read reads it again
from memory. :func:`read_into` fills a reused buffer piece by piece and takes each piece's
CRC32C while the piece is still in the CPU cache (bench/s3.md).

Contract of :class:`PartBuffers`: :meth:`~PartBuffers.take` returns a ``bytearray`` of at
least the size asked for (contents undefined); the caller gives it back with
:meth:`~PartBuffers.give` once nothing reads it any more (its request is done, whatever the
outcome) or simply drops it (a part that was never sent). The pool keeps at most ``keep``
free buffers, and taking a new buffer drops a free one that is too small, so as long as
every buffer is taken under a :class:`Budget` slot, no more buffers exist than the most slots
taken at once; a slot taken for memory of another kind calls :meth:`~PartBuffers.make_room`
first, so that bound holds for both together. :meth:`~PartBuffers.clear` drops the free
ones (when the budget goes idle).
Thread-safe.
"""

from __future__ import annotations

import io
import threading

from sidecar.storage.checksum import Crc32c

__all__ = ["PIECE", "PartBuffers", "read_into"]

#: Bytes read (and checksummed) at a time: small enough to stay in a core's L2 cache.
PIECE = 256 * 1024


class PartBuffers:
    """A pool of reusable part buffers (see the module docstring)."""

    def __init__(self, keep: int) -> None:
        self._keep = keep
        self._free: list[bytearray] = []
        self._lock = threading.Lock()

    def take(self, size: int) -> bytearray:
        """A free buffer of at least ``size`` bytes, or a new one of ``size`` bytes (a free
        one too small is dropped for it, so no more buffers exist than were taken at once)."""
        with self._lock:
            for i, buf in enumerate(self._free):
                if len(buf) >= size:
                    return self._free.pop(i)
            if self._free:
                self._free.pop(0)
        return bytearray(size)

    def give(self, buf: bytearray) -> None:
        """Take ``buf`` back for reuse (dropped if ``keep`` buffers are free already)."""
        with self._lock:
            if len(self._free) < self._keep:
                self._free.append(buf)

    def make_room(self) -> None:
        """Drop one free buffer, if any: call it when a budget slot is taken for memory that
        does not come from this pool, so that buffers and such memory together stay within
        the slots taken at once."""
        with self._lock:
            if self._free:
                self._free.pop(0)

    def clear(self) -> None:
        """Drop every free buffer (their memory goes back to the allocator)."""
        with self._lock:
            self._free.clear()

    def free_count(self) -> int:
        with self._lock:
            return len(self._free)


def read_into(f: io.BufferedIOBase, view: memoryview, crc: Crc32c, *, piece: int = PIECE) -> int:
    """Fill ``view`` from ``f`` until it is full or the file ends, ``piece`` bytes at a time,
    extending ``crc`` by each piece as it is read; return the number of bytes read. Raises
    ``OSError``."""
    n, size = 0, len(view)
    while n < size:
        got = f.readinto(view[n : min(size, n + piece)])
        if not got:
            break
        crc.update(view[n : n + got])
        n += got
    return n
