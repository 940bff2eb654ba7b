"""The chunk loop of a GCS resumable upload (JSON API), on an already opened session.

One chunk is in memory at a time. The CRC32C is computed as each chunk is read (the
only pass over the file) and sent as ``X-Goog-Hash: crc32c=...`` with the final chunk,
so GCS refuses to create an object whose bytes differ. A chunk whose request fails with
a connection error, 408, 429 or 5xx is resumed from the offset the session reports, a
few times, before giving up. On any failure, and on :class:`Cancelled` from
``progress``, the session is cancelled (``DELETE``): the final chunk was never accepted,
so no object is visible.
"""

from __future__ import annotations

import contextlib
import re
import time
from typing import Any, BinaryIO

import requests

from sidecar.storage.base import Progress, StorageError, TransientError
from sidecar.storage.checksum import Crc32c
from sidecar.storage.gcs_errors import response_message, status_error

__all__ = ["RETRY_PAUSES", "is_transient_status", "upload_resumable"]

#: pauses (seconds) before each retry of a failed request within one upload
RETRY_PAUSES = (0.25, 1.0, 4.0)
TIMEOUT = (10.0, 300.0)
_RANGE = re.compile(r"bytes=0-(\d+)")


def is_transient_status(status: int) -> bool:
    return status in (408, 429) or status >= 500


def _content_range(start: int, end: int, total: int) -> str:
    return f"bytes {start}-{end - 1}/{total}" if end > start else f"bytes */{total}"


def _persisted(resp: requests.Response) -> int:
    """Bytes the session holds, from a 308 answer's ``Range: bytes=0-N`` (none: 0)."""
    m = _RANGE.fullmatch(resp.headers.get("Range", "").strip())
    return int(m.group(1)) + 1 if m else 0


class _Session:
    """One resumable session URI (a bearer capability: it is never logged)."""

    def __init__(self, http: requests.Session, url: str, bucket: str, name: str) -> None:
        self.http, self.url, self.bucket, self.name = http, url, bucket, name

    def _error(self, resp: requests.Response) -> StorageError:
        return status_error(
            resp.status_code,
            response_message(resp),
            op="upload",
            bucket=self.bucket,
            name=self.name,
            bucket_level_404=False,
        )

    def send(self, chunk: bytes, offset: int, total: int, crc: str | None) -> dict[str, Any] | None:
        """Make the session hold ``chunk`` at ``offset``; the resource once it is final."""
        end = offset + len(chunk)
        held = offset
        failures = 0
        while True:
            headers = {"Content-Range": _content_range(held, end, total)}
            if crc is not None:
                headers["X-Goog-Hash"] = f"crc32c={crc}"
            resp: requests.Response | None = None
            with contextlib.suppress(requests.exceptions.RequestException):
                resp = self.http.put(
                    self.url, data=chunk[held - offset :], headers=headers, timeout=TIMEOUT
                )
            if resp is not None:
                if resp.status_code in (200, 201):
                    return dict(resp.json())
                if resp.status_code == 308:
                    now = _persisted(resp)
                    if now >= end:
                        return None
                    if now > held:  # the server kept part of it: send the rest at once
                        held = now
                        continue
                elif not is_transient_status(resp.status_code):
                    raise self._error(resp)
            failures += 1
            if failures > len(RETRY_PAUSES):
                if resp is not None and resp.status_code != 308:
                    raise self._error(resp)
                raise TransientError(
                    f"GCS upload gs://{self.bucket}/{self.name}: no progress after "
                    f"{failures} tries at byte {held}"
                )
            time.sleep(RETRY_PAUSES[failures - 1])
            status = self._status(total)
            if isinstance(status, dict):
                return status
            if status is not None:
                if status < offset:
                    raise TransientError(
                        f"GCS upload gs://{self.bucket}/{self.name}: the session lost bytes "
                        f"already sent (holds {status}, expected {offset}); starting again"
                    )
                held = min(status, end)
                if held >= end:
                    return None

    def _status(self, total: int) -> int | dict[str, Any] | None:
        """Ask how much the session holds: a byte count, the final resource, or None."""
        try:
            resp = self.http.put(
                self.url, headers={"Content-Range": f"bytes */{total}"}, timeout=TIMEOUT
            )
        except requests.exceptions.RequestException:
            return None
        if resp.status_code in (200, 201):
            return dict(resp.json())
        if resp.status_code == 308:
            return _persisted(resp)
        if is_transient_status(resp.status_code):
            return None
        raise self._error(resp)

    def cancel(self) -> None:
        """Best effort: GCS answers 499 and forgets the bytes."""
        with contextlib.suppress(requests.exceptions.RequestException):
            self.http.delete(self.url, timeout=(5.0, 10.0))


def upload_resumable(
    http: requests.Session,
    session_url: str,
    f: BinaryIO,
    size: int,
    *,
    chunk_size: int,
    bucket: str,
    name: str,
    progress: Progress | None = None,
) -> tuple[str, dict[str, Any]]:
    """Send ``size`` bytes of ``f`` (from its current position) through the session.

    Returns ``(crc32c_b64, object_resource)``. ``progress`` gets each chunk's size: once
    the session holds a chunk, but for the final chunk just before it is sent, so that a
    :class:`Cancelled` raised for it still leaves no object. Raises :class:`TransientError`
    when the file shrinks while being read, else the mapped :class:`StorageError`.
    """
    session = _Session(http, session_url, bucket, name)
    crc = Crc32c()
    offset = 0
    try:
        while True:
            want = min(chunk_size, size - offset)
            chunk = f.read(want)
            if len(chunk) != want:
                raise TransientError(
                    f"GCS upload gs://{bucket}/{name}: the file shrank while it was read "
                    f"({offset + len(chunk)} of {size} bytes); it is sent again once stable"
                )
            crc.update(chunk)
            final = offset + want == size
            if final and progress is not None and want:
                progress(want)
            resource = session.send(chunk, offset, size, crc.b64() if final else None)
            chunk = b""  # let it go before the next read: one chunk in memory, not two
            offset += want
            if final:
                if resource is None:
                    raise TransientError(
                        f"GCS upload gs://{bucket}/{name}: the session did not finish the object"
                    )
                return crc.b64(), resource
            if progress is not None:
                progress(want)
    except BaseException:
        session.cancel()
        raise
