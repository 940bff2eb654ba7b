"""The admin listener: /metrics /healthz /readyz /v1/status, POST /v1/flush /v1/drain.

GET endpoints answer anyone who can reach the port. POST endpoints are accepted only from
the loopback peer 127.0.0.1 or ::1 (not the rest of 127.0.0.0/8: a service mesh's proxy
hands remote callers in from 127.0.0.6) or with ``Authorization: Bearer <admin.token>``
(constant-time compare); anything else gets 403 and a log line. Unknown paths 404, wrong
methods 405, bodies over 64 KiB 413, a Content-Length that is not a whole number 400.
Runs on its own threads, at most ``MAX_CONNECTIONS`` at once (a connection beyond them is
closed unanswered), each dropped after ``IDLE_SECONDS`` without a byte: however many
callers connect, the daemon's own threads are never crowded out.
"""

from __future__ import annotations

import contextlib
import hmac
import ipaddress
import json
import socket
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import TYPE_CHECKING, Any

import structlog
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from sidecar.config_load import redacted
from sidecar.model import Notice

if TYPE_CHECKING:
    from sidecar.app import Daemon

__all__ = ["AdminServer"]

log = structlog.get_logger("sidecar.admin")
_MAX_BODY = 64 * 1024
_GET = {"/metrics", "/healthz", "/readyz", "/v1/status"}
_POST = {"/v1/flush", "/v1/drain"}
#: handler threads at once; connections beyond them are closed at once
MAX_CONNECTIONS = 32
#: a connection that sends nothing for this long is closed (slow or idle callers)
IDLE_SECONDS = 10.0
_LOCAL_PEERS = {ipaddress.ip_address("127.0.0.1"), ipaddress.ip_address("::1")}


def is_local_peer(address: str) -> bool:
    """True only for 127.0.0.1 and ::1 (also as ``::ffff:127.0.0.1``); any other address,
    loopback range or not, needs the token."""
    try:
        peer = ipaddress.ip_address(address.split("%", 1)[0])
    except ValueError:
        return False
    if isinstance(peer, ipaddress.IPv6Address) and peer.ipv4_mapped is not None:
        peer = peer.ipv4_mapped
    return peer in _LOCAL_PEERS


def status_of(d: Daemon) -> dict[str, Any]:
    n, b, others = d.queue.depth()
    with d.lock:
        current = d.current
        flights = dict(d.pool.in_flight)
    return {
        "state": "stopped" if d.stop_event.is_set() else d.drain.state,
        "notice": d.drain.notice_json(),
        "drain": d.drain.outcome,
        "queue": {"checkpoints": n, "bytes": b, "other_files": others},
        "in_flight": None
        if current is None
        else {
            "checkpoint": current.name,
            "step": current.step,
            "bytes": current.size,
            "files": [{"key": k, "sent": s, "size": z} for k, (s, z) in sorted(flights.items())],
        },
        "last_committed": d.last_committed,
        "unprotected_seconds": round(d.unprotected_seconds(), 3),
        "destination": d.backend.url,
        "config": redacted(d.cfg),
        "permanent_error": d.health.permanent_error,
    }


class _Handler(BaseHTTPRequestHandler):
    server: _Server
    protocol_version = "HTTP/1.1"
    timeout = IDLE_SECONDS

    def log_message(self, format: str, *args: Any) -> None:  # quiet; we log ourselves
        return

    def _send(self, code: int, body: bytes, ctype: str = "application/json") -> None:
        self.send_response(code)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def _json(self, code: int, obj: Any) -> None:
        self._send(code, json.dumps(obj, default=str).encode())

    def do_GET(self) -> None:
        path = self.path.split("?", 1)[0]
        d = self.server.sidecar
        if path in _POST:
            self._json(405, {"error": "use POST"})
        elif path == "/metrics":
            self._send(200, generate_latest(d.metrics.registry), CONTENT_TYPE_LATEST)
        elif path == "/healthz":
            dead = d.dead_threads()
            self._json(200 if not dead else 503, {"ok": not dead, "dead_threads": dead})
        elif path == "/readyz":
            problems = []
            if not d.health.watching:
                problems.append("not watching yet")
            if not d.health.catalog_loaded:
                problems.append("destination not reachable yet")
            if d.health.permanent_error:
                problems.append(d.health.permanent_error)
            self._json(200 if not problems else 503, {"ready": not problems, "problems": problems})
        elif path == "/v1/status":
            self._json(200, status_of(d))
        else:
            self._json(404, {"error": "not found"})

    def _allowed(self) -> bool:
        if is_local_peer(str(self.client_address[0])):
            return True
        token = self.server.token
        given = self.headers.get("Authorization", "")
        if token and given.startswith("Bearer "):
            return hmac.compare_digest(given[7:].encode(), token.encode())
        return False

    def do_POST(self) -> None:
        path = self.path.split("?", 1)[0]
        if path in _GET:
            self._json(405, {"error": "use GET"})
            return
        if path not in _POST:
            self._json(404, {"error": "not found"})
            return
        raw = (self.headers.get("Content-Length") or "0").strip()
        if not raw.isdigit():  # a negative length would read until the caller hangs up
            self.close_connection = True
            self._json(400, {"error": "Content-Length must be a whole number of bytes"})
            return
        length = int(raw)
        if length > _MAX_BODY:
            self._json(413, {"error": "body too large"})
            return
        if length:
            self.rfile.read(length)
        if not self._allowed():
            log.warning("admin.forbidden", path=path, peer=self.client_address[0])
            self._json(403, {"error": "POST needs a loopback peer or the admin token"})
            return
        d = self.server.sidecar
        if path == "/v1/flush":
            d.limiter.lift()
            d.watcher.rescan()
            log.info("admin.flush")
            self._json(202, {"accepted": True})
            return
        now, mono = time.time(), time.monotonic()
        grace = d.cfg.shutdown_grace_seconds
        n = Notice("http", "drain", now + grace, now, mono + grace, event_id=f"http-{now}")
        t = threading.Thread(target=d.notice, args=(n,), kwargs={"exit_after": False}, daemon=True)
        t.start()
        t.join(timeout=grace + 5)
        self._json(200, {"state": d.drain.state, "drain": d.drain.outcome})

    def do_PUT(self) -> None:
        self._json(405, {"error": "method not allowed"})

    do_DELETE = do_PUT
    do_PATCH = do_PUT


class _Server(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, addr: tuple[str, int], daemon: Daemon, token: str | None) -> None:
        if ":" in addr[0]:  # an IPv6 address such as "::" or "::1"
            self.address_family = socket.AF_INET6
        self._slots = threading.BoundedSemaphore(MAX_CONNECTIONS)
        super().__init__(addr, _Handler)
        self.sidecar = daemon
        self.token = token

    def process_request(self, request: Any, client_address: Any) -> None:
        if not self._slots.acquire(blocking=False):
            self.shutdown_request(request)
            return
        try:
            super().process_request(request, client_address)
        except BaseException:
            self._slots.release()
            raise

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            self._slots.release()


#: the serving thread sleeps until a connection comes; stop() makes one to end the wait
_POLL_SECONDS = 3600.0


class AdminServer:
    """Binds at construction (so a port in use fails before anything starts). While nobody
    calls, the serving thread does not wake (a wake-up is most of an idle daemon's cost)."""

    def __init__(self, daemon: Daemon, host: str, port: int, token: str | None) -> None:
        self._server = _Server((host, port), daemon, token)
        self._thread = threading.Thread(
            target=self._server.serve_forever, args=(_POLL_SECONDS,), name="admin", daemon=True
        )

    @property
    def port(self) -> int:
        return int(self._server.server_address[1])

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        """Stop serving and close the socket; returns once serving ended."""
        if not self._thread.is_alive():  # never started: shutdown() would wait for ever
            self._server.server_close()
            return
        stopper = threading.Thread(target=self._server.shutdown, daemon=True)
        stopper.start()
        while stopper.is_alive():  # until serve_forever has seen the request to stop
            with contextlib.suppress(OSError):
                socket.create_connection(self._wake_address(), timeout=1).close()
            stopper.join(0.05)
        self._server.server_close()

    def _wake_address(self) -> tuple[str, int]:
        host, port = str(self._server.server_address[0]), self.port
        return {"0.0.0.0": "127.0.0.1", "::": "::1", "": "127.0.0.1"}.get(host, host), port
