"""What every fake metadata service shares: a quiet threaded HTTP server on 127.0.0.1."""

from __future__ import annotations

import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Self


class QuietServer(ThreadingHTTPServer):
    """Joins its request threads on close; a client that went away is not an error."""

    daemon_threads = False
    block_on_close = True
    fake: Any

    def handle_error(self, request: Any, client_address: Any) -> None:
        """A client that went away is normal here (timeouts, aborted long polls)."""


class FakeHttpService:
    """``start()`` on a free loopback port, ``url``, ``stop()`` that ends hanging requests.

    Subclasses give their request handler with :meth:`handler`; handlers reach the fake as
    ``self.server.fake`` and wait on ``fake._cond`` until ``fake._stopping``.
    """

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._stopping = False
        self._server: QuietServer | None = None
        self._thread: threading.Thread | None = None

    def handler(self) -> type[BaseHTTPRequestHandler]:
        raise NotImplementedError

    @property
    def url(self) -> str:
        assert self._server is not None, "start() first"
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def start(self) -> Self:
        self._server = QuietServer(("127.0.0.1", 0), self.handler())
        self._server.fake = self
        self._thread = threading.Thread(
            target=self._server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
        )
        self._thread.start()
        return self

    def stop(self) -> None:
        with self._cond:
            self._stopping = True
            self._cond.notify_all()
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
        if self._thread is not None:
            self._thread.join(5)
