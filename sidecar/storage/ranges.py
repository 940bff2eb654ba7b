"""One object downloaded into a file in ranges fetched in parallel.

Contract of :func:`download_in_ranges`: the bytes ``[0, size)`` are fetched as ranges of
``range_size`` (the last one shorter) on ``pool``, each written at its own offset of ``path``
(created or truncated first) as its pieces arrive, so memory holds a few pieces per range in
flight, never a range. It returns the CRC32C (base64) of the whole file, combined from each
range's CRC32C in order without reading the file again. A range that delivers a byte count
other than its length raises :class:`TransientError`. The first failure (a ``StorageError``,
``OSError`` or :class:`Cancelled` from ``progress``) stops the other ranges at their next
piece and is raised once all have stopped; ``path`` is then removed. ``progress`` is called
from the pool's threads, with each piece's length.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import Executor, Future, wait
from pathlib import Path

from sidecar.fanout import all_results
from sidecar.storage.base import Cancelled, Progress, TransientError
from sidecar.storage.checksum import Crc32c

__all__ = ["RangeReader", "download_in_ranges"]

#: ``(first, last)`` byte offsets, both inclusive -> the range's bytes, in pieces
RangeReader = Callable[[int, int], Iterator[bytes]]


def download_in_ranges(
    read_range: RangeReader,
    path: Path,
    size: int,
    range_size: int,
    pool: Executor,
    progress: Progress | None = None,
) -> str:
    """Download ``size`` bytes into ``path`` (see the module docstring); return the CRC32C."""
    starts = range(0, size, range_size)
    stop = threading.Event()
    futures: list[Future[int]] = []
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o666)
    try:
        for s in starts:
            n = min(range_size, size - s)
            futures.append(pool.submit(_one_range, read_range, fd, s, n, stop, progress))
        crcs = all_results(futures, stop)
    except BaseException:
        stop.set()  # (all_results did this already, unless a submit failed)
        wait(futures)  # no range writes to ``fd`` once it is closed
        path.unlink(missing_ok=True)
        raise
    finally:
        os.close(fd)
    whole = Crc32c()
    for s, crc in zip(starts, crcs, strict=True):
        whole.extend(crc, min(range_size, size - s))
    return whole.b64()


def _one_range(
    read_range: RangeReader,
    fd: int,
    start: int,
    length: int,
    stop: threading.Event,
    progress: Progress | None,
) -> int:
    """Fetch ``length`` bytes from ``start`` into ``fd`` at ``start``; return their CRC32C."""
    if stop.is_set():
        raise Cancelled(f"range at {start}: another range failed")
    crc = Crc32c()
    offset = start
    for piece in read_range(start, start + length - 1):
        if stop.is_set():
            raise Cancelled(f"range at {start}: another range failed")
        if offset + len(piece) > start + length:
            raise TransientError(f"range at {start} sent more than its {length} bytes")
        written = 0
        while written < len(piece):  # a short write only on a full disk, before its error
            written += os.pwrite(fd, memoryview(piece)[written:], offset + written)
        crc.update(piece)
        offset += len(piece)
        if progress is not None:
            progress(len(piece))
    if offset != start + length:
        raise TransientError(f"range at {start} ended after {offset - start} of its {length} bytes")
    return crc.value()
