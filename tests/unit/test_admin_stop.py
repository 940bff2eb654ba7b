"""The admin listener sleeps until a connection comes (no polling while idle), yet stop()
ends it at once and frees the port, wherever it is bound, and also when it never started."""

from __future__ import annotations

import socket
import threading
from typing import TYPE_CHECKING, cast

import pytest

from sidecar.admin import AdminServer

if TYPE_CHECKING:
    from sidecar.app import Daemon

BOUND = 10.0  # seconds; stop() used to take up to the poll interval, now an hour


def stopped_within_bound(server: AdminServer) -> bool:
    done = threading.Event()

    def stop() -> None:
        server.stop()
        done.set()

    threading.Thread(target=stop, daemon=True).start()
    return done.wait(BOUND)


@pytest.mark.parametrize("host", ["127.0.0.1", "0.0.0.0"])
def test_stop_returns_at_once_and_frees_the_port(host: str) -> None:
    server = AdminServer(cast("Daemon", None), host, 0, None)
    port = server.port
    server.start()
    assert stopped_within_bound(server), "stop() did not return"
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection(("127.0.0.1", port), timeout=BOUND).close()


def test_stop_without_start_frees_the_port() -> None:
    server = AdminServer(cast("Daemon", None), "127.0.0.1", 0, None)
    port = server.port
    assert stopped_within_bound(server), "stop() did not return"
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection(("127.0.0.1", port), timeout=BOUND).close()
