"""Downloading one Azure blob into a file, with its CRC32C computed as the bytes arrive.

Contract of :func:`download`: ``first`` is the blob's first download (the SDK's first GET,
of up to ``range_size`` bytes, already received). A blob that fits in it is written from
it. A larger one comes in ranges of ``range_size`` on ``pool`` (:mod:`.ranges`): the first
range is the first GET's bytes, every other one a ranged GET pinned to that GET's ETag
(``If-Match``), so a blob replaced meanwhile fails the download with a
:class:`TransientError` instead of mixing two versions. Returns the size, the CRC32C of the
bytes written (combined from the ranges' without reading the file again) and the blob's
last-modified time. On any failure ``path`` is removed; service errors are mapped by
:func:`.azure_errors.map_error`, local write errors stay ``OSError``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from concurrent.futures import Executor
from pathlib import Path
from typing import Any

from azure.core import MatchConditions
from azure.core.exceptions import AzureError, ResourceModifiedError
from azure.storage.blob import BlobClient, StorageStreamDownloader

from sidecar.storage.base import ObjectInfo, Progress, StorageError, TransientError
from sidecar.storage.checksum import Crc32c
from sidecar.storage.ranges import RangeReader, download_in_ranges

__all__ = ["download"]

#: ``(error, operation)`` -> the storage error to raise (the backend's ``map_error``, bound
#: to its account, container and key)
MapError = Callable[[AzureError, str], StorageError]


def download(
    blob: BlobClient,
    first: StorageStreamDownloader[bytes],
    path: Path,
    *,
    key: str,
    range_size: int,
    pool: Executor,
    map_error: MapError,
    progress: Progress | None,
    **get_args: Any,
) -> ObjectInfo:
    """See the module docstring. ``get_args`` go with every ranged GET (``cpk``)."""
    size = first.size
    modified = first.properties.last_modified
    mtime = modified.timestamp() if modified else None
    if size <= range_size:
        crc = _one_stream(first, path, map_error, progress)
    else:
        head = _first_range(first, range_size, map_error, blob.blob_name)
        reader = _range_reader(blob, head, first.properties.etag, map_error, get_args)
        crc = download_in_ranges(reader, path, size, range_size, pool, progress)
    return ObjectInfo(key=key, size=size, crc32c=crc, mtime=mtime)


def _one_stream(
    first: StorageStreamDownloader[bytes],
    path: Path,
    map_error: MapError,
    progress: Progress | None,
) -> str:
    crc = Crc32c()
    try:
        with open(path, "wb") as out:
            for chunk in _chunks(first, map_error):
                crc.update(chunk)
                out.write(chunk)
                if progress:
                    progress(len(chunk))
    except BaseException:
        path.unlink(missing_ok=True)
        raise
    return crc.b64()


def _first_range(
    first: StorageStreamDownloader[bytes], length: int, map_error: MapError, name: str
) -> bytes:
    """The first GET's bytes: the SDK hands out what it already holds before it fetches."""
    head = next(_chunks(first, map_error), b"")
    if len(head) != length:
        raise TransientError(
            f"Azure download of {name!r}: the first GET brought {len(head)} bytes, not {length}"
        )
    return head


def _chunks(stream: StorageStreamDownloader[bytes], map_error: MapError) -> Iterator[bytes]:
    chunks = stream.chunks()
    while True:
        try:
            chunk = next(chunks, b"")
        except AzureError as e:
            raise map_error(e, "download") from None
        if not chunk:
            return
        yield chunk


def _range_reader(
    blob: BlobClient,
    head: bytes,
    etag: str,
    map_error: MapError,
    get_args: dict[str, Any],
) -> RangeReader:
    def read(first: int, last: int) -> Iterator[bytes]:
        if first == 0:
            yield head
            return
        try:
            stream = blob.download_blob(
                offset=first,
                length=last - first + 1,
                etag=etag,
                match_condition=MatchConditions.IfNotModified,
                **get_args,
            )
        except ResourceModifiedError:
            raise TransientError(
                f"Azure download of {blob.blob_name!r}: the blob was replaced during the "
                "download (its ETag changed); download it again"
            ) from None
        except AzureError as e:
            raise map_error(e, "download") from None
        yield from _chunks(stream, map_error)

    return read
