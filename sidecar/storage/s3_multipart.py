"""Multipart upload and multipart copy, parts in parallel, memory bounded.

One reader (the backend's reading thread) reads the file once, in order, into reused part
buffers: each part gets its own CRC32C (taken piece by piece as it is read), which is
combined into the whole-file CRC32C, and is reported to ``progress``. A part is
read only after it got a slot of the backend-wide :class:`Budget`, so however many files
go up at once, at most ``slots * part_size`` bytes of them are in memory. Each part
carries its CRC32C and the upload completes with the whole-file CRC32C as a FULL_OBJECT
checksum, so the store verifies both. Any failure or :class:`Cancelled` aborts the
upload: pending parts are cancelled one by one, running ones are awaited, then
AbortMultipartUpload is sent.
"""

from __future__ import annotations

import concurrent.futures as cf
import io
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import structlog

from sidecar.storage.base import Progress, TransientError
from sidecar.storage.budget import Budget
from sidecar.storage.buffers import PartBuffers, read_into
from sidecar.storage.checksum import Crc32c
from sidecar.storage.parts import send_parts
from sidecar.storage.s3_errors import StoreRejectedChecksum, map_error
from sidecar.storage.source import open_source

__all__ = [
    "BAD_DIGEST_ATTEMPTS",
    "MAX_PARTS",
    "Target",
    "abort",
    "copy_in_parts",
    "part_size_for",
    "upload_in_parts",
]

log = structlog.get_logger("sidecar.storage.s3")

MAX_PARTS = 10_000
BAD_DIGEST_ATTEMPTS = 3


@dataclass(frozen=True)
class Target:
    """Where the parts go: the client, bucket, full object key and write arguments."""

    client: Any
    bucket: str
    key: str
    write_args: dict[str, Any]


def part_size_for(size: int, part_size: int) -> int:
    """``part_size``, raised so that ``size`` fits in :data:`MAX_PARTS` parts."""
    return max(part_size, -(-size // MAX_PARTS))


def _read_part(
    f: io.BufferedIOBase, buf: bytearray, size: int, whole: Crc32c, progress: Progress | None
) -> tuple[memoryview, str]:
    """Read up to ``size`` bytes into ``buf`` and return them (a view of ``buf``) with their
    own CRC32C, taken piece by piece as they are read, which also extends the whole-file
    CRC32C (one pass over the bytes)."""
    part = Crc32c()
    n = read_into(f, memoryview(buf)[:size], part)
    whole.extend(part.value(), n)
    if progress and n:
        progress(n)
    return memoryview(buf)[:n], part.b64()


def _send_part(
    t: Target, upload_id: str, number: int, body: memoryview, crc: str
) -> dict[str, Any]:
    """UploadPart, sent again when the store answers BadDigest (bytes damaged on the way)."""
    for attempt in range(1, BAD_DIGEST_ATTEMPTS + 1):
        try:
            r = t.client.upload_part(
                Bucket=t.bucket,
                Key=t.key,
                UploadId=upload_id,
                PartNumber=number,
                Body=body,
                ChecksumCRC32C=crc,
            )
        except Exception as e:
            err = map_error(e, op="UploadPart", bucket=t.bucket, key=t.key)
            if isinstance(err, StoreRejectedChecksum) and attempt < BAD_DIGEST_ATTEMPTS:
                log.warning("s3_part_bad_digest", key=t.key, part=number, attempt=attempt)
                continue
            raise err from e
        return {"PartNumber": number, "ETag": r["ETag"], "ChecksumCRC32C": crc}
    raise AssertionError("unreachable")


def abort(t: Target, upload_id: str) -> None:
    """AbortMultipartUpload, best effort (a failure is logged; the stale sweep retries)."""
    try:
        t.client.abort_multipart_upload(Bucket=t.bucket, Key=t.key, UploadId=upload_id)
    except Exception as e:
        log.warning(
            "s3_abort_failed", key=t.key, error=str(map_error(e, op="Abort", bucket=t.bucket))
        )


def _create(t: Target) -> str:
    try:
        r = t.client.create_multipart_upload(
            Bucket=t.bucket,
            Key=t.key,
            ChecksumAlgorithm="CRC32C",
            ChecksumType="FULL_OBJECT",
            **t.write_args,
        )
    except Exception as e:
        raise map_error(e, op="CreateMultipartUpload", bucket=t.bucket, key=t.key) from e
    return str(r["UploadId"])


def _complete(t: Target, upload_id: str, parts: list[dict[str, Any]], crc: str | None) -> Any:
    extra: dict[str, Any] = {}
    if crc is not None:
        extra = {"ChecksumCRC32C": crc, "ChecksumType": "FULL_OBJECT"}
    try:
        return t.client.complete_multipart_upload(
            Bucket=t.bucket,
            Key=t.key,
            UploadId=upload_id,
            MultipartUpload={"Parts": parts},
            **extra,
        )
    except Exception as e:
        raise map_error(e, op="CompleteMultipartUpload", bucket=t.bucket, key=t.key) from e


def upload_in_parts(
    t: Target,
    path: Path,
    size: int,
    part_size: int,
    budget: Budget,
    buffers: PartBuffers,
    reader: cf.Executor,
    senders: cf.Executor,
    progress: Progress | None,
) -> tuple[int, str]:
    """Upload ``path`` (``size`` bytes when opened) to ``t``; return (bytes read, CRC32C b64).

    Each part in memory holds a ``budget`` slot from its read until its UploadPart is done,
    and a buffer of ``buffers``, given back when its UploadPart is done (whatever the
    outcome). Parts are read on ``reader`` (the backend's one reading thread) and sent on
    ``senders`` (the backend's part
    threads, shared by every upload: no threads are started per file), so memory stays near
    ``budget`` slots however many files go up at once (bench/s3.md, bench/memory.md).
    ``senders`` should have as many threads as ``budget`` has slots: with fewer, parts
    would wait for a thread while holding their buffers.

    Raises ``OSError`` (reading), :class:`Cancelled` (from ``progress``) or a
    :class:`StorageError`; in every case the multipart upload is aborted first.
    """
    part_size = part_size_for(size, part_size)
    whole = Crc32c()
    total = number = 0
    parts: list[dict[str, Any]] = []
    with open_source(path) as f:
        upload_id = _create(t)

        def next_part() -> tuple[int, bytearray, memoryview, str] | None:
            nonlocal total, number
            buf = buffers.take(part_size)
            body, crc = _read_part(f, buf, part_size, whole, progress)
            if (not body and number > 0) or number >= MAX_PARTS:
                buffers.give(buf)
                if body:
                    raise TransientError(f"{path} grew past {MAX_PARTS} parts while uploading")
                return None
            number += 1
            total += len(body)
            return number, buf, body, crc

        def send(part: tuple[int, bytearray, memoryview, str]) -> dict[str, Any]:
            number, buf, body, crc = part
            try:
                return _send_part(t, upload_id, number, body, crc)
            finally:
                buffers.give(buf)

        try:
            send_parts(
                next_part,
                send,
                parts.append,
                budget=budget,
                pool=senders,
                reader=reader,
            )
            _complete(t, upload_id, _in_order(parts), whole.b64())
        except BaseException:
            abort(t, upload_id)
            raise
    return total, whole.b64()


def _copy_part(
    t: Target, upload_id: str, number: int, source: dict[str, str], first: int, last: int
) -> dict[str, Any]:
    try:
        r = t.client.upload_part_copy(
            Bucket=t.bucket,
            Key=t.key,
            UploadId=upload_id,
            PartNumber=number,
            CopySource=source,
            CopySourceRange=f"bytes={first}-{last}",
        )
    except Exception as e:
        raise map_error(e, op="UploadPartCopy", bucket=t.bucket, key=t.key) from e
    part: dict[str, Any] = {"PartNumber": number, "ETag": r["CopyPartResult"]["ETag"]}
    crc = r["CopyPartResult"].get("ChecksumCRC32C")
    if crc:
        part["ChecksumCRC32C"] = crc
    return part


def copy_in_parts(
    t: Target,
    source: dict[str, str],
    size: int,
    crc: str | None,
    part_size: int,
    concurrency: int,
    senders: cf.Executor,
) -> None:
    """Server-side copy of ``source`` (``size`` bytes, whole-object ``crc`` if known) with
    UploadPartCopy, at most ``concurrency`` parts at once on ``senders``; no object bytes
    pass through this process."""
    part_size = part_size_for(size, part_size)
    upload_id = _create(t)
    ranges = iter(enumerate(range(0, size, part_size), start=1))
    parts: list[dict[str, Any]] = []

    def next_part() -> tuple[int, int, int] | None:
        number, first = next(ranges, (0, -1))
        return None if first < 0 else (number, first, min(first + part_size, size) - 1)

    try:
        send_parts(
            next_part,
            lambda p: _copy_part(t, upload_id, p[0], source, p[1], p[2]),
            parts.append,
            budget=Budget(concurrency),
            pool=senders,
        )
        _complete(t, upload_id, _in_order(parts), crc)
    except BaseException:
        abort(t, upload_id)
        raise


def _in_order(parts: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return sorted(parts, key=lambda p: int(p["PartNumber"]))
