"""The fault proxy's outage is what the store-fault trials rely on: every connection through it
is reset at once, including one whose request is waiting for its reply. (Before, a client
waiting for a reply kept waiting until its own read timeout, 60 s for botocore, and the
outage trial timed out in CI.)"""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field

import pytest

from tests.servers.faultproxy import FaultProxy

BOUND = 30.0  # seconds a client waits before the test calls it a hang


@dataclass
class Upstream:
    """A store that answers each message with ``b"ok"``, but only once ``release`` is set;
    ``received`` is set when a message arrived."""

    port: int = 0
    release: threading.Event = field(default_factory=threading.Event)
    received: threading.Event = field(default_factory=threading.Event)


@pytest.fixture
def upstream() -> Iterator[Upstream]:
    up = Upstream()
    server = socket.create_server(("127.0.0.1", 0))
    up.port = server.getsockname()[1]

    def handle(conn: socket.socket) -> None:
        with conn:
            try:
                while conn.recv(100):
                    up.received.set()
                    up.release.wait()
                    conn.sendall(b"ok")
            except OSError:
                return

    def accept() -> None:
        while True:
            try:
                conn, _ = server.accept()
            except OSError:
                return
            threading.Thread(target=handle, args=(conn,), daemon=True).start()

    threading.Thread(target=accept, daemon=True).start()
    yield up
    up.release.set()
    server.close()


@pytest.fixture
def proxy(upstream: Upstream) -> Iterator[FaultProxy]:
    p = FaultProxy("127.0.0.1", upstream.port)
    yield p
    p.close()


def test_a_request_waiting_for_its_reply_is_reset(proxy: FaultProxy, upstream: Upstream) -> None:
    with socket.create_connection(("127.0.0.1", proxy.port), timeout=BOUND) as c:
        c.sendall(b"PUT")
        assert upstream.received.wait(BOUND)  # the request is with the store, its reply held
        proxy.outage()
        with pytest.raises(ConnectionResetError):
            c.recv(100)


def test_an_idle_pooled_connection_is_reset(proxy: FaultProxy, upstream: Upstream) -> None:
    upstream.release.set()
    with socket.create_connection(("127.0.0.1", proxy.port), timeout=BOUND) as c:
        c.sendall(b"GET")
        assert c.recv(100) == b"ok"
        proxy.outage()
        with pytest.raises(ConnectionResetError):
            c.recv(100)


def test_a_reply_that_comes_after_the_connect_timeout_arrives(upstream: Upstream) -> None:
    """A store is silent until a slow body has arrived in full, however long that takes. The
    proxy's connect timeout used to stay on the store's socket as a read timeout, so every
    request that took over 10 s through a throttled uplink was closed unanswered."""
    p = FaultProxy("127.0.0.1", upstream.port, connect_timeout=0.2)
    try:
        with socket.create_connection(("127.0.0.1", p.port), timeout=BOUND) as c:
            c.sendall(b"PUT")
            assert upstream.received.wait(BOUND)
            answer = threading.Timer(1.0, upstream.release.set)  # 5x the connect timeout
            answer.start()
            assert c.recv(100) == b"ok"
            answer.join()
    finally:
        p.close()


def test_a_new_connection_in_an_outage_is_refused_and_counted(proxy: FaultProxy) -> None:
    proxy.outage()
    # the reset can arrive before connect() returns (seen under load) or at the first read
    with (
        pytest.raises(ConnectionResetError),
        socket.create_connection(("127.0.0.1", proxy.port), timeout=BOUND) as c,
    ):
        c.recv(100)
    assert proxy.faults.counts["refused"] == 1
