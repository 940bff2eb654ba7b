"""The admin listener stands up to callers that misbehave: a bad Content-Length is answered
400 at once, an idle connection is dropped, however many connections come the listener holds
at most MAX_CONNECTIONS threads and answers again once they go, only 127.0.0.1 and ::1 count
as local, and an IPv6 address binds."""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator
from typing import TYPE_CHECKING, cast

import pytest

from sidecar import admin
from sidecar.admin import MAX_CONNECTIONS, AdminServer, is_local_peer

if TYPE_CHECKING:
    from sidecar.app import Daemon

BOUND = 10.0  # seconds a well-behaved reply may take on a busy machine


@pytest.fixture
def server() -> Iterator[AdminServer]:
    s = AdminServer(cast("Daemon", None), "127.0.0.1", 0, None)  # paths used need no daemon
    s.start()
    yield s
    s.stop()


def _ask(port: int, request: bytes, host: str = "127.0.0.1") -> bytes:
    """Send one raw request; return what came back before the server closed (b"" when it
    closed unanswered). A server that goes quiet for BOUND seconds fails the test: a hang
    must not pass for a close."""
    with socket.create_connection((host, port), timeout=BOUND) as c:
        c.sendall(request)
        got = b""
        try:
            while b"\r\n\r\n" not in got:
                chunk = c.recv(4096)
                if not chunk:
                    break
                got += chunk
        except TimeoutError:
            pytest.fail(f"no answer and no close within {BOUND} s (got {got!r})")
        return got


GET_NOPE = b"GET /nope HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"


@pytest.mark.parametrize("length", [b"-1", b"abc", b"1e3"])
def test_a_content_length_that_is_not_a_whole_number_gets_400_at_once(
    server: AdminServer, length: bytes
) -> None:
    got = _ask(
        server.port,
        b"POST /v1/flush HTTP/1.1\r\nHost: x\r\nContent-Length: " + length + b"\r\n\r\n",
    )
    assert got.startswith(b"HTTP/1.1 400"), got


def test_an_idle_connection_is_dropped(monkeypatch: pytest.MonkeyPatch) -> None:
    assert admin._Handler.timeout == admin.IDLE_SECONDS <= 60, "silent callers kept for ever"
    monkeypatch.setattr(admin._Handler, "timeout", 0.5)  # the same, sooner
    s = AdminServer(cast("Daemon", None), "127.0.0.1", 0, None)
    s.start()
    try:
        with socket.create_connection(("127.0.0.1", s.port), timeout=BOUND) as c:
            assert c.recv(1) == b"", "the server kept a silent connection open"
    finally:
        s.stop()


def test_connections_beyond_the_limit_hold_no_thread_and_the_listener_recovers(
    server: AdminServer,
) -> None:
    before = threading.active_count()
    idle = [
        socket.create_connection(("127.0.0.1", server.port), timeout=BOUND)
        for _ in range(MAX_CONNECTIONS + 20)
    ]
    try:
        # Connections are taken in order: this one is seen after all the idle ones.
        assert _ask(server.port, GET_NOPE) == b"", "answered beyond the limit"
        assert threading.active_count() - before <= MAX_CONNECTIONS
    finally:
        for c in idle:
            c.close()
    answered, retry = b"", threading.Event()
    for _ in range(200):  # the handlers see the closes on their own threads
        answered = _ask(server.port, GET_NOPE)
        if answered:
            break
        retry.wait(0.05)
    assert answered.startswith(b"HTTP/1.1 404"), answered


@pytest.mark.parametrize(
    ("address", "local"),
    [
        ("127.0.0.1", True),
        ("::1", True),
        ("::ffff:127.0.0.1", True),
        ("127.0.0.6", False),  # a service mesh's inbound proxy
        ("127.0.1.1", False),
        ("10.0.0.7", False),
        ("fe80::1%eth0", False),
        ("not an address", False),
    ],
)
def test_only_127_0_0_1_and_1_count_as_local(address: str, local: bool) -> None:
    assert is_local_peer(address) is local


def test_an_ipv6_host_binds_and_answers_on_both_families() -> None:
    s = AdminServer(cast("Daemon", None), "::", 0, None)
    s.start()
    try:
        assert _ask(s.port, GET_NOPE, "::1").startswith(b"HTTP/1.1 404")
        assert _ask(s.port, GET_NOPE, "127.0.0.1").startswith(b"HTTP/1.1 404")
    finally:
        s.stop()
