"""The one protocol every notice source implements, its errors, and a small metadata client.

A :class:`Source` is one poll: :meth:`Source.poll` looks once and returns a
:class:`~sidecar.model.Notice` or ``None``. It never loops, sleeps or logs errors itself;
the :class:`~sidecar.preemption.poller.Poller` owns timing, error reporting and
de-duplication. Anything that goes wrong is raised as :class:`SourceError`, and a
:class:`SourceError` is never a notice (a metadata service that cannot be reached says
nothing about preemption).
"""

from __future__ import annotations

import contextlib
import email.utils
import http.client
import socket
import threading
import time
from dataclasses import dataclass
from datetime import datetime
from email.message import Message
from typing import Protocol, runtime_checkable
from urllib.parse import urlsplit

from sidecar.model import Notice

__all__ = [
    "MAX_BODY_BYTES",
    "MetadataHttp",
    "Response",
    "Source",
    "SourceError",
    "make_notice",
    "parse_rfc1123",
    "parse_rfc3339",
]

MAX_BODY_BYTES = 64 * 1024


class SourceError(Exception):
    """One failed look. ``kind`` is a stable short name (``connection``, ``timeout``,
    ``http_503``, ``token_timeout`` ...) that the poller logs once and counts; ``fix`` says
    what an operator can do, when something can be done."""

    def __init__(self, kind: str, message: str, fix: str | None = None) -> None:
        super().__init__(message)
        self.kind = kind
        self.fix = fix


@runtime_checkable
class Source(Protocol):
    """A notice source.

    ``name`` is the ``Notice.source`` it produces (``aws``, ``gcp``, ``azure``, ``file``).
    ``interval`` is the time between the starts of two polls; 0 means that :meth:`poll`
    blocks by itself until something may have changed (a long poll). Every method may be
    called from a thread other than the one that created the source; :meth:`close` from any
    thread, while :meth:`poll` runs.
    """

    name: str
    interval: float

    def poll(self) -> Notice | None:
        """Look once. Returns a notice when one is present now (the same notice again on
        later polls is fine: the poller de-duplicates by ``event_id``). Raises
        :class:`SourceError`; never turns a failure into a notice."""
        ...

    def acknowledge(self, notice: Notice) -> bool:
        """Tell the cloud we are done with ``notice`` (Azure ``StartRequests`` when so
        configured); ``True`` when the cloud was told, ``False`` when there is nothing to
        tell. Works after :meth:`close`. Raises :class:`SourceError`."""
        ...

    def close(self) -> None:
        """Abort a request in flight and refuse new ones; idempotent."""
        ...


def make_notice(
    source: str,
    kind: str,
    event_id: str,
    *,
    deadline: float | None = None,
    seconds_left: float | None = None,
    drain: bool = True,
    detail: dict[str, str] | None = None,
) -> Notice:
    """A notice received now: ``deadline`` (wall seconds) or ``seconds_left`` from now.

    The monotonic deadline is fixed here, once, so later wall-clock steps cannot move it."""
    now, mono = time.time(), time.monotonic()
    if deadline is None:
        deadline = now + (seconds_left or 0.0)
    return Notice(
        source=source,
        kind=kind,
        deadline=deadline,
        received_at=now,
        deadline_mono=mono + (deadline - now),
        event_id=event_id,
        drain=drain,
        detail=dict(detail or {}),
    )


def parse_rfc3339(text: str) -> float | None:
    """``2026-12-02T08:22:00Z`` -> wall seconds; ``None`` when unreadable or without zone."""
    try:
        dt = datetime.fromisoformat(text.strip())
    except ValueError:
        return None
    return dt.timestamp() if dt.tzinfo is not None else None


def parse_rfc1123(text: str) -> float | None:
    """``Mon, 19 Sep 2016 18:29:47 GMT`` -> wall seconds; ``None`` when empty or unreadable."""
    try:
        return email.utils.parsedate_to_datetime(text.strip()).timestamp()
    except (TypeError, ValueError, IndexError):
        return None


@dataclass(frozen=True)
class Response:
    status: int
    headers: Message
    body: bytes


class MetadataHttp:
    """Plain HTTP/1.1 to one link-local metadata endpoint (no proxies, no keep-alive).

    :meth:`request` returns any status as a :class:`Response`; it raises
    :class:`SourceError` (``timeout`` or ``connection``) only when no response arrived.
    :meth:`close`, from any thread, aborts a request in flight within milliseconds.
    """

    def __init__(self, base_url: str, timeout: float) -> None:
        parts = urlsplit(base_url)
        if parts.scheme != "http" or not parts.hostname:
            raise ValueError(f"metadata endpoint must be http://host[:port], got {base_url!r}")
        self.base_url = base_url.rstrip("/")
        self._host = parts.hostname
        self._port = parts.port or 80
        self._prefix = parts.path.rstrip("/")
        self._timeout = timeout
        self._lock = threading.Lock()
        self._open: set[http.client.HTTPConnection] = set()
        self._closed = False

    def request(
        self,
        method: str,
        path: str,
        headers: dict[str, str],
        *,
        body: bytes | None = None,
        read_timeout: float | None = None,
    ) -> Response:
        conn = http.client.HTTPConnection(self._host, self._port, timeout=self._timeout)
        with self._lock:
            if self._closed:
                raise SourceError("closed", "the source is closed")
            self._open.add(conn)
        url = self.base_url + path
        try:
            conn.connect()
            with self._lock:
                if self._closed:
                    raise SourceError("closed", "the source is closed")
            if read_timeout is not None and conn.sock is not None:
                conn.sock.settimeout(read_timeout)
            conn.request(method, self._prefix + path, body=body, headers=headers)
            resp = conn.getresponse()
            return Response(resp.status, resp.headers, resp.read(MAX_BODY_BYTES))
        except TimeoutError:
            raise SourceError("timeout", f"{method} {url}: no answer in time") from None
        except (OSError, http.client.HTTPException) as e:
            if self._closed:
                raise SourceError("closed", "the source is closed") from None
            raise SourceError(
                "connection", f"{method} {url}: {str(e) or type(e).__name__}"
            ) from None
        finally:
            with self._lock:
                self._open.discard(conn)
            conn.close()

    def close(self) -> None:
        with self._lock:
            self._closed = True
            for conn in self._open:
                if conn.sock is not None:
                    with contextlib.suppress(OSError):
                        conn.sock.shutdown(socket.SHUT_RDWR)
