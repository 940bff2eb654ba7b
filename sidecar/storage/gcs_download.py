"""GCS downloads: one media GET (JSON API) through the backend's session, a block at a time.

google-cloud-storage reads a download's response 8 KiB at a time (its module constant
``_SINGLE_GET_CHUNK_SIZE``) and checksums and writes each piece: about 0.7 CPU-s per GB
more than reading it in blocks of :data:`~sidecar.storage.body.BLOCK` bytes, as
here (bench/restore.md). The bytes are taken as stored (no gzip decoding, as the
library's ``raw_download``), their CRC32C computed in the same pass as they are written.

Guarantees of :func:`download`: on return the file holds the object's bytes, as many as
the response's ``Content-Length``, and when the store sent a CRC32C in ``X-Goog-Hash``
(GCS does, and so do both emulators the tests use) they match it; a store that sends none
gets no check here, as with the library, and the caller's comparison with the manifest is
the check. Raises :class:`NotFound` for a missing object,
:class:`~sidecar.storage.gcs_errors.CorruptedInTransit` (a :class:`ChecksumMismatch`)
when the bytes differ from the CRC32C sent, :class:`TransientError` when the connection
fails, the reply ends short, or GCS answers 408, 410, 429 or 5xx on every attempt (one,
then one after each pause of :data:`~sidecar.storage.gcs_resumable.RETRY_PAUSES`, each
starting over; bytes written again are not reported to ``progress`` twice),
:class:`PermanentError` for other refusals; :class:`Cancelled` from ``progress``
propagates. The caller removes the file on any failure.
"""

from __future__ import annotations

import time
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

__all__ = ["download", "media_url", "stored_crc32c"]


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


def download(
    http: requests.Session,
    base_url: str,
    bucket: str,
    name: str,
    out: BinaryIO,
    progress: Progress | None = None,
) -> tuple[int, str]:
    """Write ``gs://bucket/name`` to ``out`` (an empty file opened for writing).

    Returns the size and the base64 CRC32C of the bytes written. See the module for
    what is guaranteed and raised.
    """
    url = media_url(base_url, bucket, name)
    ticker = _Ticker(progress)
    for pause in (*gcs_resumable.RETRY_PAUSES, None):
        try:
            return _attempt(http, url, bucket, name, out, ticker)
        except CorruptedInTransit:
            raise  # damage is not retried here: the caller decides (as with the library)
        except TransientError:
            if pause is None:
                raise
        except (requests.exceptions.RequestException, urllib3.exceptions.HTTPError) as e:
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
) -> tuple[int, str]:
    where = f"gs://{bucket}/{name}"
    with http.get(url, stream=True, timeout=TIMEOUT) as resp:
        if resp.status_code != 200:
            raise _refusal(resp, bucket, name)
        expected = stored_crc32c(resp)
        length = resp.headers.get("Content-Length")
        crc = Crc32c()
        size = 0
        while block := resp.raw.read(BLOCK, decode_content=False):
            crc.update(block)
            out.write(block)
            size += len(block)
            ticker.advance(size)
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
