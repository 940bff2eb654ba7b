"""A fake Azure Instance Metadata Service (Scheduled Events), faithful to the documented rules.

* Every request needs ``Metadata: true`` and an ``api-version`` (400 otherwise) and no
  ``X-Forwarded-For`` (400).
* ``GET /metadata/scheduledevents`` answers ``{"DocumentIncarnation": n, "Events": [...]}``;
  ``n`` grows with every change. The very first call can be made slow (``first_call_delay``),
  as on a VM where the service starts on first use.
* An event goes Scheduled (``NotBefore`` RFC 1123) -> Started (``NotBefore`` empty) -> gone;
  ``POST`` ``{"StartRequests": [{"EventId": ...}]}`` approves (starts) it.
* Events may name other VMs in ``Resources``.
* ``GET /metadata/instance/compute/name?...&format=text`` answers the VM name.

Start with :meth:`start`, stop with :meth:`stop`, or use the ``azure_metadata`` fixture.
"""

from __future__ import annotations

import email.utils
import json
import time
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from http.server import BaseHTTPRequestHandler
from typing import Any
from urllib.parse import parse_qs, urlsplit

import pytest

from tests.servers.fakehttp import FakeHttpService, QuietServer

__all__ = ["FakeAzureMetadata", "azure_metadata"]


class FakeAzureMetadata(FakeHttpService):
    """See the module docstring. Thread-safe; every method may be called while serving."""

    def __init__(self, vm_name: str = "gpu-vm-0", first_call_delay: float = 0.0) -> None:
        super().__init__()
        self.vm_name = vm_name
        self.first_call_delay = first_call_delay
        self.flipped_at: float | None = None
        self.approved: list[str] = []
        self.event_calls = 0
        self._events: dict[str, dict[str, Any]] = {}
        self._incarnation = 1

    def handler(self) -> type[BaseHTTPRequestHandler]:
        return _Handler

    def schedule(
        self,
        event_type: str = "Preempt",
        resources: list[str] | None = None,
        not_before: datetime | None = None,
    ) -> str:
        """Add a Scheduled event (for this VM unless ``resources`` says otherwise, not before
        ``not_before``, default now + 30 s); returns its EventId."""
        when = not_before or datetime.now(UTC) + timedelta(seconds=30)
        event_id = str(uuid.uuid4()).upper()
        event = {
            "EventId": event_id,
            "EventStatus": "Scheduled",
            "EventType": event_type,
            "ResourceType": "VirtualMachine",
            "Resources": resources if resources is not None else [self.vm_name],
            "NotBefore": email.utils.format_datetime(when.astimezone(UTC), usegmt=True),
            "Description": f"{event_type} scheduled by the fake",
            "EventSource": "Platform",
            "DurationInSeconds": -1,
        }
        self._change(lambda: self._events.__setitem__(event_id, event))
        return event_id

    def start_event(self, event_id: str) -> None:
        """Scheduled -> Started: ``NotBefore`` becomes empty."""
        self._change(lambda: self._events[event_id].update(EventStatus="Started", NotBefore=""))

    def finish(self, event_id: str) -> None:
        """Started -> gone."""
        self._change(lambda: self._events.pop(event_id))

    def _change(self, edit: Any) -> None:
        with self._cond:
            edit()
            self._incarnation += 1
            self.flipped_at = time.monotonic()

    def handle(self, h: _Handler, method: str) -> None:
        url = urlsplit(h.path)
        query = {k: v[-1] for k, v in parse_qs(url.query).items()}
        if h.headers.get("Metadata", "").lower() != "true" or h.headers.get("X-Forwarded-For"):
            return h.reply(400, {"error": "Bad request. Required metadata header not specified"})
        if "api-version" not in query:
            return h.reply(400, {"error": "Bad request. api-version was not specified"})
        if url.path == "/metadata/instance/compute/name" and method == "GET":
            if query.get("format") != "text":
                return h.reply(400, {"error": "Bad request. Leaf nodes need format=text"})
            return h.reply(200, self.vm_name)
        if url.path != "/metadata/scheduledevents":
            return h.reply(404, {"error": "Not found"})
        if method == "POST":
            return self._approve(h)
        with self._cond:
            self.event_calls += 1
            if self.event_calls == 1 and self.first_call_delay > 0:
                end = time.monotonic() + self.first_call_delay
                while not self._stopping and time.monotonic() < end:
                    self._cond.wait(end - time.monotonic())
            doc = {"DocumentIncarnation": self._incarnation, "Events": list(self._events.values())}
            body = json.loads(json.dumps(doc))
        return h.reply(200, body)

    def _approve(self, h: _Handler) -> None:
        length = int(h.headers.get("Content-Length", "0"))
        try:
            requests = json.loads(h.rfile.read(length))["StartRequests"]
            ids = [str(r["EventId"]) for r in requests]
        except (ValueError, KeyError, TypeError):
            return h.reply(400, {"error": "Bad request. Malformed StartRequests"})
        for event_id in ids:
            with self._cond:
                known = event_id in self._events
                self.approved.append(event_id)
            if known:
                self.start_event(event_id)
        return h.reply(200, "")


class _Server(QuietServer):
    fake: FakeAzureMetadata


class _Handler(BaseHTTPRequestHandler):
    server: _Server

    def do_GET(self) -> None:
        self.server.fake.handle(self, "GET")

    def do_POST(self) -> None:
        self.server.fake.handle(self, "POST")

    def reply(self, status: int, doc: Any) -> None:
        is_text = isinstance(doc, str)
        body = doc.encode() if is_text else json.dumps(doc).encode()
        self.send_response(status)
        self.send_header("Content-Type", "text/plain" if is_text else "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:
        pass


@pytest.fixture
def azure_metadata() -> Iterator[FakeAzureMetadata]:
    fake = FakeAzureMetadata().start()
    try:
        yield fake
    finally:
        fake.stop()
