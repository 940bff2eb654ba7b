"""A fake Compute Engine metadata server, faithful to the documented rules.

* ``GET /computeMetadata/v1/<key>`` needs ``Metadata-Flavor: Google`` (403 without it, and
  403 with ``X-Forwarded-For``); answers the value as text with ``Metadata-Flavor: Google``
  and an ``ETag`` that depends on the value only (the same value, the same ETag).
* ``?wait_for_change=true`` hangs until the value changes, or ``timeout_sec`` passes (then
  the current value). With ``last_etag`` different from the current ETag it answers at once.
* :meth:`fail_next` makes the next requests answer an error status (503 by default).
* :meth:`preempt` flips ``instance/preempted`` to ``TRUE``; :meth:`set` changes any key.

Start with :meth:`start`, stop with :meth:`stop`, or use the ``gcp_metadata`` fixture.
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler
from typing import Any
from urllib.parse import parse_qs, urlsplit

import pytest

from tests.servers.fakehttp import FakeHttpService, QuietServer

__all__ = ["FakeGcpMetadata", "etag_of", "gcp_metadata"]

PREFIX = "/computeMetadata/v1/"


def etag_of(value: str) -> str:
    return hashlib.sha256(value.encode()).hexdigest()[:16]


class FakeGcpMetadata(FakeHttpService):
    """See the module docstring. Thread-safe; every method may be called while serving."""

    def __init__(self) -> None:
        super().__init__()
        self.flipped_at: float | None = None
        self._values = {
            "instance/preempted": "FALSE",
            "instance/maintenance-event": "NONE",
            "instance/name": "gpu-vm-0",
        }
        self._failures: list[int] = []
        self._waiting = 0
        self._requests = 0

    def handler(self) -> type[BaseHTTPRequestHandler]:
        return _Handler

    @property
    def host(self) -> str:
        """``host:port``, the form ``GCE_METADATA_HOST`` takes."""
        assert self._server is not None, "start() first"
        return f"127.0.0.1:{self._server.server_address[1]}"

    @property
    def waiting(self) -> int:
        """Hanging ``wait_for_change`` requests right now."""
        with self._cond:
            return self._waiting

    @property
    def requests(self) -> int:
        with self._cond:
            return self._requests

    def set(self, key: str, value: str) -> None:
        with self._cond:
            self._values[key] = value
            self.flipped_at = time.monotonic()
            self._cond.notify_all()

    def preempt(self) -> None:
        self.set("instance/preempted", "TRUE")

    def fail_next(self, count: int, status: int = 503) -> None:
        with self._cond:
            self._failures.extend([status] * count)

    def get(self, h: _Handler) -> None:
        url = urlsplit(h.path)
        query = {k: v[-1] for k, v in parse_qs(url.query).items()}
        with self._cond:
            self._requests += 1
        if h.headers.get("Metadata-Flavor") != "Google" or h.headers.get("X-Forwarded-For"):
            return h.reply(403, "Missing required header: Metadata-Flavor\n")
        key = url.path.removeprefix(PREFIX)
        with self._cond:
            if self._failures:
                return h.reply(self._failures.pop(0), "Service Unavailable\n")
            if not url.path.startswith(PREFIX) or key not in self._values:
                return h.reply(404, "Not Found\n")
            if query.get("wait_for_change") == "true":
                self._wait(key, query)
                if self._stopping:
                    h.close_connection = True
                    return None
            value = self._values[key]
        return h.reply(200, value, etag=etag_of(value))

    def _wait(self, key: str, query: dict[str, str]) -> None:
        """Hang (lock held by the caller) until the value differs from ``last_etag``, or
        from the value now when none is given, or ``timeout_sec`` passes."""
        start = etag_of(self._values[key])
        last = query.get("last_etag", start)
        if last != start:
            return
        timeout = float(query.get("timeout_sec", "3600"))
        end = time.monotonic() + timeout
        self._waiting += 1
        try:
            while etag_of(self._values[key]) == last and not self._stopping:
                left = end - time.monotonic()
                if left <= 0:
                    return
                self._cond.wait(left)
        finally:
            self._waiting -= 1


class _Server(QuietServer):
    fake: FakeGcpMetadata


class _Handler(BaseHTTPRequestHandler):
    server: _Server

    def do_GET(self) -> None:
        self.server.fake.get(self)

    def reply(self, status: int, text: str, etag: str | None = None) -> None:
        body = text.encode()
        self.send_response(status)
        self.send_header("Metadata-Flavor", "Google")
        self.send_header("Content-Type", "application/text")
        self.send_header("Content-Length", str(len(body)))
        if etag is not None:
            self.send_header("ETag", etag)
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:
        pass


@pytest.fixture
def gcp_metadata() -> Iterator[FakeGcpMetadata]:
    fake = FakeGcpMetadata().start()
    try:
        yield fake
    finally:
        fake.stop()
