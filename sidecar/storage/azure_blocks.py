"""Stage a file as block-blob blocks in parallel, reading it once.

One pass over the file: each block is read, added to the whole-file CRC32C, given its
CRC-64 (sent as ``x-ms-content-crc64``, which the service verifies) and staged by a worker. At most
``concurrency`` blocks are in flight, so memory stays near ``block_size * (concurrency + 1)``.
Nothing is committed here: staged blocks stay invisible until the caller commits the list,
and uncommitted blocks are discarded by the service after a week.
"""

from __future__ import annotations

import concurrent.futures as cf
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import BinaryIO

from awscrt import checksums

from sidecar.storage.base import Progress
from sidecar.storage.checksum import Crc32c

__all__ = [
    "MAX_BLOCKS",
    "StageBlock",
    "StagedFile",
    "block_size_for",
    "content_crc64",
    "stage_file",
]

MAX_BLOCKS = 50_000
MAX_BLOCK = 4000 * 1024 * 1024
_MiB = 1024 * 1024

StageBlock = Callable[[str, bytes, bytes], None]
"""``stage(block_id, data, crc64)``: put one block; raises a ``StorageError``."""


def content_crc64(data: bytes) -> bytes:
    """The ``x-ms-content-crc64`` value of ``data``: Azure Storage's CRC-64 (the CRC-64/NVME
    polynomial, the same as the SDK's azure-storage-extensions computes) as 8 little-endian
    bytes. About 20x cheaper than the MD5 alternative (bench/azure.md)."""
    crc: int = checksums.crc64nvme(data)
    return crc.to_bytes(8, "little")


@dataclass
class StagedFile:
    """What was read and staged: block ids in order, byte count, whole-file CRC32C."""

    block_ids: list[str] = field(default_factory=list)
    size: int = 0
    crc: Crc32c = field(default_factory=Crc32c)


def block_size_for(size: int, wanted: int) -> int:
    """``wanted``, raised (in whole MiB) so that ``size`` fits in the service's 50,000 blocks."""
    need = -(-size // MAX_BLOCKS)
    if need <= wanted:
        return wanted
    return min(MAX_BLOCK, -(-need // _MiB) * _MiB)


def stage_file(
    f: BinaryIO, stage: StageBlock, *, block_size: int, concurrency: int, progress: Progress | None
) -> StagedFile:
    """Read ``f`` to its end and stage every block; return the ids to commit.

    ``progress`` is called in this thread with each block's length once the service has
    it. Whatever it or a block raises (``Cancelled``, a ``StorageError``, ``OSError`` from
    reading) stops reading, cancels blocks not yet sent, waits for those in flight and is
    re-raised; nothing is committed.
    """
    # Fixed-length ids, unique per upload: the service wants every id of a blob the same
    # length, and two uploads to one key must never mix blocks.
    tag = uuid.uuid4().hex[:16]
    out = StagedFile()
    pool = cf.ThreadPoolExecutor(max_workers=concurrency, thread_name_prefix="azure-block")
    pending: set[cf.Future[int]] = set()

    def settle(wait_for: str) -> None:
        nonlocal pending
        done, pending = cf.wait(pending, return_when=wait_for)
        for fut in done:
            n = fut.result()
            if progress:
                progress(n)

    def send(block_id: str, data: bytes) -> int:
        stage(block_id, data, content_crc64(data))
        return len(data)

    try:
        while block := f.read(block_size):
            out.crc.update(block)
            out.size += len(block)
            block_id = f"{tag}-{len(out.block_ids):06d}"
            out.block_ids.append(block_id)
            pending.add(pool.submit(send, block_id, block))
            del block
            if len(pending) >= concurrency:
                settle(cf.FIRST_COMPLETED)
        while pending:
            settle(cf.FIRST_COMPLETED)
    finally:
        pool.shutdown(wait=True, cancel_futures=True)
    return out
