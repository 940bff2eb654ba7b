"""A plain-HTTP forward proxy on loopback that records what it relays (for the tests that
check the clients honour the environment's proxy variables)."""

from __future__ import annotations

import http.client
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import urlsplit

__all__ = ["ForwardProxy", "forward_proxy"]

_HOP_BY_HOP = {"connection", "keep-alive", "proxy-connection", "transfer-encoding"}


class ForwardProxy(ThreadingHTTPServer):
    """Relays each request (absolute URL in the request line, as clients send to an HTTP
    proxy) to its origin and records ``"<METHOD> <absolute URL>"`` in :attr:`seen`."""

    daemon_threads = True

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), _Relay)
        self.seen: list[str] = []

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"


class _Relay(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: ForwardProxy

    def _relay(self) -> None:
        self.server.seen.append(f"{self.command} {self.path}")
        target = urlsplit(self.path)
        body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        headers = {k: v for k, v in self.headers.items() if k.lower() not in _HOP_BY_HOP}
        conn = http.client.HTTPConnection(target.netloc, timeout=30)
        try:
            path = target.path + (f"?{target.query}" if target.query else "")
            conn.request(self.command, path, body=body, headers=headers)
            resp = conn.getresponse()
            data = resp.read()
        finally:
            conn.close()
        self.send_response(resp.status, resp.reason)
        for k, v in resp.getheaders():
            if k.lower() not in _HOP_BY_HOP | {"content-length"}:
                self.send_header(k, v)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(data)

    do_GET = do_PUT = do_HEAD = do_DELETE = do_POST = do_PATCH = _relay

    def log_message(self, *args: object) -> None:
        pass


@contextmanager
def forward_proxy() -> Iterator[ForwardProxy]:
    server = ForwardProxy()
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server
    finally:
        server.shutdown()
        server.server_close()
