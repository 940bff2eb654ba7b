"""Copy one open file into another with the CRC32C of the bytes the copy holds.

The copy runs inside the kernel (``sendfile(2)``) in 256 KiB pieces; each piece is then
read back from the destination, still in the CPU cache, for the checksum. So every byte
enters this process once instead of twice (read, then write), and the checksum is of the
bytes the destination holds, computed in the same pass. Where the kernel cannot copy (not
Linux, a file system without splice support, or any error of the in-kernel copy), the rest
of the file goes by ``pread``/``pwrite`` through one reused buffer, which also tells a
failed read of the source from a failed write of the destination.

With ``write_behind``, after each 8 MiB the kernel is asked (``posix_fadvise(DONTNEED)``)
to start writing back what was copied and to drop what is already written back. So the
disk or the network volume works while the copy goes on, the final fsync waits only for
the tail, and the copy does not fill the page cache (charged to the daemon's memory
cgroup) with a second image of the checkpoint: tens of MB of it are cached at any time.
The caller drops the rest after its fsync.
"""

from __future__ import annotations

import contextlib
import errno
import os
import threading

from sidecar.storage.base import Progress
from sidecar.storage.checksum import Crc32c

__all__ = ["COPY_CHUNK", "WRITE_BEHIND", "WriteError", "copy_with_crc", "drop_cached"]

#: bytes per piece: small enough that a piece is still in the CPU cache when it is read back
#: (or, without the in-kernel copy, written out). 1 MiB pieces cost 0.79-0.85 CPU-s/GB
#: against 0.61-0.78 for 256 KiB (bench/file_copy.md, 2026-12-03 20:25).
COPY_CHUNK = 256 * 1024
#: with ``write_behind``, bytes copied between two requests to start write-back
WRITE_BEHIND = 8 * 1024 * 1024

_local = threading.local()


class WriteError(OSError):
    """The destination could not be written or read back (errno as the kernel gave it)."""


def copy_with_crc(
    src: int, dst: int, *, progress: Progress | None = None, write_behind: bool = False
) -> tuple[int, Crc32c]:
    """Copy ``src`` from its start to its end of file into ``dst`` from offset 0.

    ``dst`` must be open for reading and writing and empty. Returns the bytes copied and
    the CRC32C of what ``dst`` now holds. ``progress`` is called with each piece's size.
    Raises :class:`WriteError` when the destination fails (full, read-only, I/O error) and
    a plain ``OSError`` when reading the source fails. Does not fsync; with
    ``write_behind`` the caller should fsync and then call :func:`drop_cached`.
    """
    crc = Crc32c()
    view = _buffer()
    offset = advised = 0
    while True:
        try:
            n = os.sendfile(dst, src, offset, COPY_CHUNK)
        except (OSError, AttributeError):  # AttributeError: no os.sendfile on this platform
            return _copy_through_buffer(src, dst, offset, crc, view, progress)
        if n == 0:
            return offset, crc
        _read_back(dst, offset, view[:n])
        crc.update(view[:n])
        offset += n
        if write_behind and offset - advised >= WRITE_BEHIND:
            # from the start, since write-back of earlier pieces may have ended since the
            # last call: advising only the newest 8 MiB left all of a 2 GiB copy cached
            # until the fsync (the newest 16 MiB: 60 %); from the start, 8-42 MB at most
            drop_cached(dst, 0, offset)
            advised = offset
        if progress:
            progress(n)


def drop_cached(fd: int, offset: int = 0, length: int = 0) -> None:
    """Start write-back of ``fd``'s dirty pages in the range and drop its clean ones from the
    page cache (``length`` 0: to the end). Advice only: a file system that refuses it is
    left as it is."""
    with contextlib.suppress(OSError, AttributeError):  # no posix_fadvise on macOS
        os.posix_fadvise(fd, offset, length, os.POSIX_FADV_DONTNEED)


def _buffer() -> memoryview:
    """This thread's piece buffer, made once: a new zero-filled 256 KiB for each file cost
    0.05 ms a file, 0.5 CPU-s for a checkpoint of 10,000 small files."""
    view: memoryview | None = getattr(_local, "view", None)
    if view is None:
        view = _local.view = memoryview(bytearray(COPY_CHUNK))
    return view


def _read_back(dst: int, offset: int, into: memoryview) -> None:
    got = 0
    while got < len(into):
        try:
            n = os.preadv(dst, [into[got:]], offset + got)
        except OSError as e:
            raise WriteError(e.errno, f"read back the copy: {e.strerror}") from e
        if n == 0:
            raise WriteError(errno.EIO, "the destination holds fewer bytes than were copied")
        got += n


def _copy_through_buffer(
    src: int, dst: int, offset: int, crc: Crc32c, view: memoryview, progress: Progress | None
) -> tuple[int, Crc32c]:
    while n := os.preadv(src, [view], offset):
        crc.update(view[:n])
        written = 0
        while written < n:
            try:
                written += os.pwrite(dst, view[written:n], offset + written)
            except OSError as e:
                raise WriteError(e.errno, e.strerror) from e
        offset += n
        if progress:
            progress(n)
    return offset, crc
