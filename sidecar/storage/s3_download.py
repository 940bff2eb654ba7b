"""Downloading one S3 object into a file, checked against the store's whole-object CRC32C.

Contract of :func:`download`: ``response`` is the object's first GET (with
``ChecksumMode=ENABLED``). An object of at most ``range_size`` bytes is streamed from it; a
larger one comes in ranges of ``range_size`` on ``pool`` (:mod:`.ranges`), each pinned to
that GET's ETag, so an object replaced meanwhile fails the download (a
:class:`TransientError` saying so) instead of mixing two versions. Either way the CRC32C of
the bytes written is computed as they arrive and, where the store reports a whole-object
CRC32C, compared with it: :class:`ChecksumMismatch` if they differ. On any failure ``path``
is removed; store errors are mapped by :func:`.s3_errors.map_error`, local write errors stay
``OSError``.
"""

from __future__ import annotations

from collections.abc import Iterator
from concurrent.futures import Executor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from botocore.exceptions import ClientError

from sidecar.storage.base import ChecksumMismatch, ObjectInfo, Progress, TransientError
from sidecar.storage.checksum import CHUNK, Crc32c
from sidecar.storage.ranges import RangeReader, download_in_ranges
from sidecar.storage.s3_client import full_crc
from sidecar.storage.s3_errors import error_code, map_error

__all__ = ["Source", "download"]

#: What a ranged GET pinned with ``If-Match`` gets once the object was replaced
_REPLACED = {"PreconditionFailed", "412"}


@dataclass(frozen=True)
class Source:
    """The object: ``full_key`` in the bucket, ``key`` as the caller names it (in errors)."""

    client: Any
    bucket: str
    full_key: str
    key: str


def download(
    src: Source,
    response: Any,
    path: Path,
    *,
    range_size: int,
    pool: Executor,
    progress: Progress | None,
) -> ObjectInfo:
    """See the module docstring."""
    size = int(response.get("ContentLength") or 0)
    expected = full_crc(response)
    if size <= range_size:
        crc, size = _one_stream(src, response, path, progress)
    else:
        response["Body"].close()
        reader = _range_reader(src, response.get("ETag"))
        crc = download_in_ranges(reader, path, size, range_size, pool, progress)
    if expected is not None and expected != crc:
        path.unlink(missing_ok=True)
        raise ChecksumMismatch(
            f"s3://{src.bucket}/{src.full_key}: read CRC32C {crc}, the store reports {expected}"
        )
    return ObjectInfo(key=src.key, size=size, crc32c=crc, mtime=None)


def _chunks(src: Source, body: Any) -> Iterator[bytes]:
    """``body`` in pieces of up to :data:`CHUNK`; network errors mapped to the store's."""
    chunks = body.iter_chunks(CHUNK)
    try:
        while True:
            try:
                chunk = next(chunks, b"")
            except Exception as e:
                raise map_error(e, op="GetObject", bucket=src.bucket, key=src.key) from e
            if not chunk:
                return
            yield chunk
    finally:
        body.close()


def _one_stream(
    src: Source, response: Any, path: Path, progress: Progress | None
) -> tuple[str, int]:
    crc = Crc32c()
    size = 0
    try:
        with open(path, "wb") as out:
            for chunk in _chunks(src, response["Body"]):
                crc.update(chunk)
                out.write(chunk)
                size += len(chunk)
                if progress:
                    progress(len(chunk))
    except BaseException:
        path.unlink(missing_ok=True)
        raise
    finally:
        response["Body"].close()  # also when the file could not be opened
    return crc.b64(), size


def _range_reader(src: Source, etag: str | None) -> RangeReader:
    pin = {"IfMatch": etag} if etag else {}

    def read(first: int, last: int) -> Iterator[bytes]:
        try:
            r = src.client.get_object(
                Bucket=src.bucket, Key=src.full_key, Range=f"bytes={first}-{last}", **pin
            )
        except Exception as e:
            if etag and isinstance(e, ClientError) and error_code(e) in _REPLACED:
                raise TransientError(
                    f"s3://{src.bucket}/{src.full_key}: the object was replaced during the "
                    "download (its ETag changed); download it again"
                ) from None
            raise map_error(e, op="GetObject", bucket=src.bucket, key=src.key) from e
        yield from _chunks(src, r["Body"])

    return read
