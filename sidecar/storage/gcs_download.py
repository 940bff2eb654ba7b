"""GCS downloads: media GETs (JSON API) through the backend's session, a block at a time.

google-cloud-storage reads a download's response 8 KiB at a time (its module constant
``_SINGLE_GET_CHUNK_SIZE``) and checksums and writes each piece: about 0.7 CPU-s per GB
more than reading it in blocks of :data:`~sidecar.storage.body.BLOCK` bytes, as
here (bench/restore.md). The bytes are taken as stored (no gzip decoding, as the
library's ``raw_download``), their CRC32C computed in the same pass as they are written.

An object larger than ``range_size`` whose first GET names its generation
(``X-Goog-Generation``: GCS and fake-gcs-server send it) and no stored encoding but
``identity`` comes in ranges of ``range_size`` on ``pool`` (:mod:`.ranges`; GCS calls
this a sliced download): the first range is read from the first GET's reply, every other
range is a GET of that generation (``generation=``), so an object replaced meanwhile fails
the download instead of mixing two versions. A range whose reply breaks is asked again
from the byte where it broke. Otherwise the object comes in one stream.

Guarantees of :func:`download`: on return ``path`` holds the object's bytes, as many as
the first response's ``Content-Length``, and when the store sent a CRC32C in
``X-Goog-Hash`` (GCS does, and so do both emulators the tests use) they match it (for
ranges, their CRC32Cs combined); a store that sends none gets no check here, as with the
library, and the caller's comparison with the manifest is the check. Raises
:class:`NotFound` for a missing object,
:class:`~sidecar.storage.gcs_errors.CorruptedInTransit` (a :class:`ChecksumMismatch`)
when the bytes differ from the CRC32C sent, :class:`TransientError` when the connection
fails, the reply ends short, GCS answers 408, 410, 429 or 5xx on every attempt (one,
then one after each pause of :data:`~sidecar.storage.gcs_resumable.RETRY_PAUSES`; one
stream starts over, a range goes on from where it broke; bytes written again are not
reported to ``progress`` twice), or the generation is gone (the object was replaced or
deleted), :class:`PermanentError` for other refusals; :class:`Cancelled` from
``progress`` propagates. On any failure ``path`` is removed.
"""

from __future__ import annotations

import re
import time
from collections.abc import Iterator
from concurrent.futures import Executor
from pathlib import Path
from typing import BinaryIO
from urllib.parse import quote

import requests
import urllib3

from sidecar.storage import gcs_resumable
from sidecar.storage.base import Progress, StorageError, TransientError
from sidecar.storage.body import BLOCK
from sidecar.storage.checksum import Crc32c
from sidecar.storage.gcs_errors import (
    CorruptedInTransit,
    map_error,
    response_message,
    status_error,
)
from sidecar.storage.gcs_resumable import TIMEOUT
from sidecar.storage.ranges import RangeReader, download_in_ranges

__all__ = ["download", "media_url", "stored_crc32c"]

#: What a request or the read of a streamed reply raises when the connection fails
_NETWORK_ERRORS = (requests.exceptions.RequestException, urllib3.exceptions.HTTPError)


def media_url(base_url: str, bucket: str, name: str) -> str:
    """The JSON API media URL of ``gs://bucket/name`` (the one the library downloads from)."""
    return (
        f"{base_url.rstrip('/')}/download/storage/v1/b/{quote(bucket, safe='')}"
        f"/o/{quote(name, safe='~')}?alt=media"
    )


def stored_crc32c(resp: requests.Response) -> str | None:
    """The base64 CRC32C of ``X-Goog-Hash`` (``crc32c=...,md5=...``), or None when absent."""
    for item in resp.headers.get("X-Goog-Hash", "").split(","):
        kind, _, value = item.strip().partition("=")
        if kind.lower() == "crc32c" and value:
            return value
    return None


class _Ranged(Exception):
    """Raised by the first attempt, once its headers are read, to go on in ranges: its
    reply ``first``, still open, is the first range (whoever catches this closes it)."""

    def __init__(
        self, first: requests.Response, size: int, expected: str | None, generation: str
    ) -> None:
        super().__init__(size)
        self.first = first
        self.size = size
        self.expected = expected
        self.generation = generation


def download(
    http: requests.Session,
    base_url: str,
    bucket: str,
    name: str,
    path: Path,
    *,
    range_size: int,
    pool: Executor,
    progress: Progress | None = None,
) -> tuple[int, str]:
    """Write ``gs://bucket/name`` to ``path`` (created or truncated).

    Returns the size and the base64 CRC32C of the bytes written. See the module for
    what is guaranteed and raised.
    """
    url = media_url(base_url, bucket, name)
    where = f"gs://{bucket}/{name}"
    try:
        with open(path, "wb") as out:
            try:
                return _one_stream(http, url, bucket, name, out, progress, range_size)
            except _Ranged as r:
                ranged = r
        try:
            reader = _range_reader(http, url, bucket, name, ranged)
            crc = download_in_ranges(reader, path, ranged.size, range_size, pool, progress)
        finally:
            ranged.first.close()
        if ranged.expected is not None and crc != ranged.expected:
            raise CorruptedInTransit(
                f"GCS download {where}: CRC32C mismatch (GCS sent {ranged.expected}, the "
                f"ranges received make {crc})"
            )
        return ranged.size, crc
    except BaseException:
        path.unlink(missing_ok=True)
        raise


def _one_stream(
    http: requests.Session,
    url: str,
    bucket: str,
    name: str,
    out: BinaryIO,
    progress: Progress | None,
    range_size: int,
) -> tuple[int, str]:
    """The whole object in one GET, started over on a transient failure; raises
    :class:`_Ranged` instead when the first reply says it can come in ranges."""
    ticker = _Ticker(progress)
    for pause in (*gcs_resumable.RETRY_PAUSES, None):
        try:
            return _attempt(http, url, bucket, name, out, ticker, range_size)
        except CorruptedInTransit:
            raise  # damage is not retried here: the caller decides (as with the library)
        except TransientError:
            if pause is None:
                raise
        except _NETWORK_ERRORS as e:
            if pause is None:
                raise map_error(e, op="download", bucket=bucket, name=name) from None
        time.sleep(pause)
        out.seek(0)
        out.truncate()
    raise AssertionError("unreachable")  # pragma: no cover - the last attempt returns or raises


def _attempt(
    http: requests.Session,
    url: str,
    bucket: str,
    name: str,
    out: BinaryIO,
    ticker: _Ticker,
    range_size: int,
) -> tuple[int, str]:
    """One GET of the whole object; with ``range_size``, :class:`_Ranged` for an object
    larger than it that names its generation and is stored as it is."""
    where = f"gs://{bucket}/{name}"
    resp = http.get(url, stream=True, timeout=TIMEOUT)
    handed_on = False
    try:
        if resp.status_code != 200:
            raise _refusal(resp, bucket, name)
        expected = stored_crc32c(resp)
        length = resp.headers.get("Content-Length")
        generation = resp.headers.get("X-Goog-Generation", "")
        encoding = resp.headers.get("X-Goog-Stored-Content-Encoding", "identity")
        if (
            range_size
            and length is not None
            and int(length) > range_size
            and generation.isdigit()
            and encoding == "identity"
        ):
            handed_on = True
            raise _Ranged(resp, int(length), expected, generation)
        crc = Crc32c()
        size = 0
        while block := resp.raw.read(BLOCK, decode_content=False):
            crc.update(block)
            out.write(block)
            size += len(block)
            ticker.advance(size)
    finally:
        if not handed_on:
            resp.close()
    if length is not None and int(length) != size:
        raise TransientError(
            f"GCS download {where}: the response ended after {size} of {length} bytes"
        )
    if expected is not None and crc.b64() != expected:
        raise CorruptedInTransit(
            f"GCS download {where}: CRC32C mismatch (GCS sent {expected}, the bytes "
            f"received make {crc.b64()})"
        )
    return size, crc.b64()


def _range_reader(
    http: requests.Session, url: str, bucket: str, name: str, ranged: _Ranged
) -> RangeReader:
    """Ranges of the generation the first GET named; the first range is read from that
    GET's reply. A reply that fails or breaks is asked again from the byte where it broke,
    after each pause of ``RETRY_PAUSES`` (the first GET's at once)."""
    generation = ranged.generation
    pinned = f"{url}&generation={generation}"

    def read(first: int, last: int) -> Iterator[bytes]:
        at = first  # the next byte to hand out
        if first == 0:
            try:
                while at <= last and (
                    block := ranged.first.raw.read(min(BLOCK, last + 1 - at), decode_content=False)
                ):
                    at += len(block)
                    yield block
            except _NETWORK_ERRORS:
                pass  # asked again below, from where it broke
            finally:
                ranged.first.close()
            if at > last:
                return
        for pause in (*gcs_resumable.RETRY_PAUSES, None):
            try:
                with http.get(
                    pinned, headers={"Range": f"bytes={at}-{last}"}, stream=True, timeout=TIMEOUT
                ) as resp:
                    _check_range(resp, at, last, bucket, name, generation)
                    while block := resp.raw.read(BLOCK, decode_content=False):
                        at += len(block)
                        yield block
                if at > last:
                    return
                error: StorageError = TransientError(
                    f"GCS download gs://{bucket}/{name}: a range reply ended at byte {at} "
                    f"of {first}-{last}"
                )
            except StorageError as e:
                error = e
            except _NETWORK_ERRORS as e:
                error = map_error(e, op="download", bucket=bucket, name=name)
            if pause is None or not isinstance(error, TransientError) or isinstance(error, _Final):
                raise error
            time.sleep(pause)

    return read


class _Final(TransientError):
    """A range answer that asking again cannot mend (the generation is gone, or the store
    ignores ranges for the object); the download as a whole may be tried again later."""


_CONTENT_RANGE = re.compile(r"bytes (\d+)-(\d+)/\d+")


def _check_range(
    resp: requests.Response, first: int, last: int, bucket: str, name: str, generation: str
) -> None:
    """Raise unless ``resp`` is the range ``first``-``last`` asked for."""
    where = f"GCS download gs://{bucket}/{name}"
    if resp.status_code == 404:
        raise _Final(
            f"{where}: generation {generation} is gone (the object was replaced or deleted "
            "during the download); download it again"
        )
    if resp.status_code != 206:
        if resp.status_code == 200:
            raise _Final(f"{where}: the store answered a range with the whole object")
        raise _refusal(resp, bucket, name)
    m = _CONTENT_RANGE.fullmatch(resp.headers.get("Content-Range", ""))
    if m is None or (int(m[1]), int(m[2])) != (first, last):
        raise TransientError(
            f"{where}: asked for bytes {first}-{last}, the store sent "
            f"{resp.headers.get('Content-Range')!r}"
        )


class _Ticker:
    """Reports to ``progress`` the bytes beyond the most ever reported, so an attempt that
    starts over does not count its bytes twice."""

    def __init__(self, progress: Progress | None) -> None:
        self.progress = progress
        self.reported = 0

    def advance(self, size: int) -> None:
        """``size`` bytes of this attempt are written: report those never reported."""
        if self.progress is not None and size > self.reported:
            self.progress(size - self.reported)
            self.reported = size


def _refusal(resp: requests.Response, bucket: str, name: str) -> StorageError:
    return status_error(
        resp.status_code, response_message(resp), op="download", bucket=bucket, name=name
    )
