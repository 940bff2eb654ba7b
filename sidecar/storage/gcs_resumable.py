"""The request loop of a GCS resumable upload (JSON API), on an already opened session.

The file is streamed: each request's body is read from disk as it is sent, in blocks of
:data:`BLOCK` bytes, so an upload holds about one block in memory whatever the request
size. The CRC32C is computed in the same read (the only pass over the file) and sent as
``X-Goog-Hash: crc32c=...`` with a final request that carries only the last 1 to 256 KiB
(read whole before it is sent, since the header goes first), so GCS refuses to create an
object whose bytes differ. The bytes before it go in one request, or in requests of at
most ``chunk_size`` bytes (whole multiples of 256 KiB, as GCS requires of every request but
the last).

A request that fails with a connection error, 408, 429 or 5xx is resumed from the offset
the session reports, a few times, before giving up; bytes sent again are neither counted
twice in the CRC32C nor reported twice to ``progress``. On any failure, and on
:class:`Cancelled` from ``progress`` (also raised mid-request), the session is cancelled
(``DELETE``): the final request was never accepted, so no object is visible.
"""

from __future__ import annotations

import contextlib
import functools
import re
import time
from collections.abc import Callable, Iterator
from typing import Any, BinaryIO

import requests

from sidecar.storage.base import Progress, StorageError, TransientError
from sidecar.storage.body import BLOCK  # bytes read from the file and sent at a time
from sidecar.storage.checksum import Crc32c
from sidecar.storage.gcs_errors import response_message, status_error

__all__ = ["QUANTUM", "RETRY_PAUSES", "is_transient_status", "upload_resumable"]

#: pauses (seconds) before each retry of a failed request within one upload
RETRY_PAUSES = (0.25, 1.0, 4.0)
#: every request but the last must carry a whole multiple of this many bytes
QUANTUM = 256 * 1024
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


class _ReadFailed(Exception):
    """Reading the file failed inside a request body. Not an ``OSError``: urllib3 and requests
    would take one for a broken connection and the session would retry it as such;
    :func:`upload_resumable` raises the ``OSError`` itself instead."""

    def __init__(self, err: OSError) -> None:
        super().__init__(str(err))
        self.err = err


class _Reader:
    """Reads the file for the whole upload; CRC32C and progress of bytes read the first time."""

    def __init__(self, f: BinaryIO, size: int, where: str, progress: Progress | None) -> None:
        self.f, self.size, self.where, self.progress = f, size, where, progress
        self.base = f.tell()
        self.crc = Crc32c()
        self.seen = 0  # bytes [0, seen) are in the CRC32C
        self._unreported = 0

    def read(self, offset: int, n: int) -> bytes:
        """``n`` bytes at ``offset``; raises :class:`TransientError` if the file is shorter,
        :class:`_ReadFailed` if it cannot be read."""
        try:
            self.f.seek(self.base + offset)
            data = self.f.read(n)
        except OSError as e:
            raise _ReadFailed(e) from e
        if len(data) != n:
            raise TransientError(
                f"GCS upload {self.where}: the file shrank while it was read "
                f"({offset + len(data)} of {self.size} bytes); it is sent again once stable"
            )
        if offset > self.seen:  # the session claims bytes never sent: do not guess
            raise TransientError(
                f"GCS upload {self.where}: the session holds bytes not sent yet "
                f"(asked for byte {offset}, sent {self.seen}); starting again"
            )
        if offset + n > self.seen:
            new = memoryview(data)[self.seen - offset :]
            self.crc.update(new)
            self.seen += len(new)
            self._unreported += len(new)
            if self._unreported >= BLOCK:
                self.report()
        return data

    def report(self) -> None:
        """Pass the bytes read but not yet reported to ``progress`` (may raise Cancelled)."""
        if self.progress is not None and self._unreported:
            n, self._unreported = self._unreported, 0
            self.progress(n)


class _Body:
    """A request body: bytes ``[start, end)`` of the file, streamed; iterable again, since
    an authorized session re-sends the same body after refreshing its token."""

    def __init__(self, reader: _Reader, start: int, end: int) -> None:
        self.reader, self.start, self.end = reader, start, end

    def __len__(self) -> int:  # requests sends it as Content-Length, not chunked
        return self.end - self.start

    def __iter__(self) -> Iterator[bytes]:
        pos = self.start
        while pos < self.end:
            block = self.reader.read(pos, min(BLOCK, self.end - pos))
            pos += len(block)
            yield block
        self.reader.report()


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

    def send(
        self, body: Callable[[int], Any], offset: int, end: int, total: int, crc: str | None
    ) -> dict[str, Any] | None:
        """Make the session hold bytes ``[offset, end)``, sending ``body(held)`` from the
        first byte it does not hold; the object resource once it is final."""
        held = offset
        failures = 0
        while True:
            headers = {"Content-Range": _content_range(held, end, total)}
            if crc is not None:
                headers["X-Goog-Hash"] = f"crc32c={crc}"
            resp: requests.Response | None = None
            with contextlib.suppress(requests.exceptions.RequestException):
                resp = self.http.put(self.url, data=body(held), headers=headers, timeout=TIMEOUT)
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
    chunk_size: int | None,
    bucket: str,
    name: str,
    progress: Progress | None = None,
) -> tuple[str, dict[str, Any]]:
    """Send ``size`` (> 0) bytes of ``f`` (from its current position) through the session,
    in requests of at most ``chunk_size`` bytes (a multiple of :data:`QUANTUM`; ``None``:
    one request for all but the last piece).

    Returns ``(crc32c_b64, object_resource)``. ``progress`` gets the bytes read from the
    file, each byte once, in steps of about :data:`BLOCK`; the final request's bytes just
    before it is sent, so that a :class:`Cancelled` raised for them still leaves no object.
    Raises :class:`TransientError` when the file shrinks while being read, ``OSError`` when it
    cannot be read (a local fault, not the store's), else the mapped :class:`StorageError`.
    """
    session = _Session(http, session_url, bucket, name)
    reader = _Reader(f, size, f"gs://{bucket}/{name}", progress)
    tail = (size - 1) // QUANTUM * QUANTUM  # the final request carries [tail, size)
    offset = 0
    try:
        while offset < tail:
            end = min(offset + chunk_size, tail) if chunk_size else tail
            session.send(functools.partial(_Body, reader, end=end), offset, end, size, None)
            offset = end
        last = reader.read(tail, size - tail)
        reader.report()
        crc = reader.crc.b64()
        resource = session.send(lambda held: last[held - tail :], tail, size, size, crc)
        if resource is None:
            raise TransientError(
                f"GCS upload gs://{bucket}/{name}: the session did not finish the object"
            )
        return crc, resource
    except _ReadFailed as e:
        session.cancel()
        raise e.err from None
    except BaseException:
        session.cancel()
        raise
