"""A fake EC2 instance metadata service (IMDS), faithful to the documented IMDSv2 rules.

* ``PUT /latest/api/token`` needs ``X-aws-ec2-metadata-token-ttl-seconds`` (1..21600, else
  400), refuses ``X-Forwarded-For`` (403), answers a token and the granted TTL header.
* Every ``GET`` needs a live token (``X-aws-ec2-metadata-token``): a missing one is 401
  (IMDSv2-only, the default; ``imdsv1_allowed=True`` accepts it), an unknown or expired
  one is 401.
* ``spot/instance-action`` and ``events/recommendations/rebalance`` are 404 until
  :meth:`interrupt` / :meth:`recommend_rebalance`, then JSON.
* :meth:`hang_token_put` makes token PUTs hang (what a hop limit of 1 does to a container).

Start with :meth:`start`, stop with :meth:`stop`, or use the ``aws_metadata`` fixture.
"""

from __future__ import annotations

import json
import secrets
import time
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from http.server import BaseHTTPRequestHandler
from typing import Any

import pytest

from tests.servers.fakehttp import FakeHttpService, QuietServer

__all__ = ["FakeAwsMetadata", "Hit", "aws_metadata"]

TTL_HEADER = "X-aws-ec2-metadata-token-ttl-seconds"
ACTION_PATH = "/latest/meta-data/spot/instance-action"
REBALANCE_PATH = "/latest/meta-data/events/recommendations/rebalance"


@dataclass(frozen=True)
class Hit:
    method: str
    path: str
    status: int
    at: float


class FakeAwsMetadata(FakeHttpService):
    """See the module docstring. Thread-safe; every method may be called while serving."""

    def __init__(self, *, imdsv1_allowed: bool = False) -> None:
        super().__init__()
        self.imdsv1_allowed = imdsv1_allowed
        self.flipped_at: float | None = None
        self._tokens: dict[str, float] = {}
        self._documents: dict[str, bytes] = {"/latest/meta-data/instance-id": b"i-0fake"}
        self._hang = False
        self._hits: list[Hit] = []

    def handler(self) -> type[BaseHTTPRequestHandler]:
        return _Handler

    def interrupt(self, action: str = "terminate", at: datetime | None = None) -> datetime:
        """From now on ``spot/instance-action`` answers ``action`` at ``at`` (now + 2 min)."""
        when = at or datetime.now(UTC) + timedelta(minutes=2)
        doc = {"action": action, "time": when.strftime("%Y-%m-%dT%H:%M:%SZ")}
        self._publish(ACTION_PATH, doc)
        return when

    def recommend_rebalance(self, at: datetime | None = None) -> None:
        when = at or datetime.now(UTC)
        self._publish(REBALANCE_PATH, {"noticeTime": when.strftime("%Y-%m-%dT%H:%M:%SZ")})

    def expire_tokens(self) -> None:
        """Every token issued so far is expired from now on (401 when used)."""
        with self._cond:
            self._tokens = dict.fromkeys(self._tokens, 0.0)

    def hang_token_put(self, on: bool = True) -> None:
        with self._cond:
            self._hang = on
            self._cond.notify_all()

    def hits(self, method: str | None = None, status: int | None = None) -> list[Hit]:
        with self._cond:
            return [
                h
                for h in self._hits
                if (method is None or h.method == method) and (status is None or h.status == status)
            ]

    def _publish(self, path: str, doc: dict[str, Any]) -> None:
        with self._cond:
            self._documents[path] = json.dumps(doc).encode()
            self.flipped_at = time.monotonic()

    def _record(self, method: str, path: str, status: int) -> None:
        with self._cond:
            self._hits.append(Hit(method, path, status, time.monotonic()))

    def put_token(self, h: _Handler) -> None:
        if h.headers.get("X-Forwarded-For"):
            return h.reply(403, b"Forbidden")
        with self._cond:
            while self._hang and not self._stopping:
                self._cond.wait()
            if self._stopping:
                h.close_connection = True
                return None
        raw = h.headers.get(TTL_HEADER, "")
        if not raw.isdigit() or not 1 <= int(raw) <= 21600:
            return h.reply(400, b"Bad Request")
        token = secrets.token_urlsafe(24)
        with self._cond:
            self._tokens[token] = time.monotonic() + int(raw)
        return h.reply(200, token.encode(), {TTL_HEADER: raw})

    def get(self, h: _Handler) -> None:
        token = h.headers.get("X-aws-ec2-metadata-token")
        with self._cond:
            if token is None:
                live = self.imdsv1_allowed
            else:
                live = self._tokens.get(token, 0.0) > time.monotonic()
            body = self._documents.get(h.path)
        if not live:
            return h.reply(401, b"Unauthorized")
        if body is None:
            return h.reply(404, b"Not Found")
        return h.reply(200, body)


class _Server(QuietServer):
    fake: FakeAwsMetadata


class _Handler(BaseHTTPRequestHandler):
    server: _Server

    def do_PUT(self) -> None:
        if self.path == "/latest/api/token":
            self.server.fake.put_token(self)
        else:
            self.reply(404, b"Not Found")

    def do_GET(self) -> None:
        self.server.fake.get(self)

    def reply(self, status: int, body: bytes, headers: dict[str, str] | None = None) -> None:
        self.server.fake._record(self.command, self.path, status)
        self.send_response(status)
        self.send_header("Content-Type", "text/plain")
        self.send_header("Content-Length", str(len(body)))
        for k, v in (headers or {}).items():
            self.send_header(k, v)
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:
        pass


@pytest.fixture
def aws_metadata() -> Iterator[FakeAwsMetadata]:
    fake = FakeAwsMetadata().start()
    try:
        yield fake
    finally:
        fake.stop()
