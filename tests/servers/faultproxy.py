"""A fault-injecting TCP proxy for HTTP stores: throttle, refuse, reset mid-body, answer 503.

It sits between a client and a real local server (SeaweedFS, Azurite...). Modes are changed
at run time from the test; the proxy counts what it did so tests can assert on it.
"""

from __future__ import annotations

import contextlib
import socket
import struct
import threading
import time
from dataclasses import dataclass, field

__all__ = ["FaultProxy"]

_LINGER_RESET = struct.pack("ii", 1, 0)  # SO_LINGER on, 0 s: close() sends a reset

_SLOWDOWN = (
    b"HTTP/1.1 503 Slow Down\r\nContent-Type: application/xml\r\nContent-Length: 120\r\n"
    b"Connection: close\r\n\r\n"
    b'<?xml version="1.0"?><Error><Code>SlowDown</Code><Message>Please reduce your request '
    b"rate.</Message></Error>".ljust(120)
)


@dataclass
class Faults:
    """What the proxy does now. ``rate`` caps client-to-server bytes/s over all connections
    together, like an uplink (0 = no limit)."""

    rate: int = 0
    refuse: bool = False
    slowdown: bool = False
    reset_after_bytes: int = 0  # reset client->server streams after this many bytes (0 = never)
    delay: float = 0.0
    counts: dict[str, int] = field(default_factory=dict)
    changed: threading.Condition = field(default_factory=threading.Condition)

    def count(self, what: str) -> None:
        with self.changed:
            self.counts[what] = self.counts.get(what, 0) + 1
            self.changed.notify_all()


class FaultProxy:
    """Forwards 127.0.0.1:``port`` to the target. ``connect_timeout`` bounds only the connect
    to the target: once connected, a store may stay silent for as long as a slow body takes
    to arrive (a 64 MiB part over a 2 MiB/s uplink: 32 s) without the proxy closing it."""

    def __init__(self, target_host: str, target_port: int, connect_timeout: float = 10.0) -> None:
        self.target = (target_host, target_port)
        self.connect_timeout = connect_timeout
        self.faults = Faults()
        self._lock = threading.Lock()
        self._sock = socket.create_server(("127.0.0.1", 0))
        self.port = self._sock.getsockname()[1]
        self._stop = threading.Event()
        self._conns: set[socket.socket] = set()
        self._uplink_free_at = 0.0  # monotonic time the shared uplink is free again
        self._thread = threading.Thread(target=self._accept, daemon=True)
        self._thread.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def set(self, **changes: object) -> None:
        with self._lock:
            for k, v in changes.items():
                setattr(self.faults, k, v)

    def outage(self) -> None:
        """The store goes away: new connections are refused and open ones (a client's
        keep-alive pool, a request waiting for its reply) are reset."""
        with self._lock:
            self.faults.refuse = True
            conns = list(self._conns)
        for c in conns:
            _reset(c)

    def wait_count(self, what: str, n: int, timeout: float = 60.0) -> int:
        """Wait until the proxy has done ``what`` at least ``n`` times; the count."""
        f = self.faults
        with f.changed:
            ok = f.changed.wait_for(lambda: f.counts.get(what, 0) >= n, timeout)
            assert ok, f"proxy: {what} {f.counts.get(what, 0)} times in {timeout} s, wanted {n}"
            return f.counts[what]

    def heal(self) -> None:
        self.set(rate=0, refuse=False, slowdown=False, reset_after_bytes=0, delay=0.0)

    def close(self) -> None:
        self._stop.set()
        with contextlib.suppress(OSError):
            self._sock.shutdown(socket.SHUT_RDWR)  # wakes the accept (close alone does not)
        self._sock.close()
        with self._lock:
            conns = list(self._conns)
        for c in conns:
            _reset(c)
        self._thread.join(5)
        assert not self._thread.is_alive(), "fault proxy: the accept thread did not stop"

    def _accept(self) -> None:
        while not self._stop.is_set():
            try:
                client, _ = self._sock.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(client,), daemon=True).start()

    def _serve(self, client: socket.socket) -> None:
        f = self.faults
        if f.refuse:
            f.count("refused")
            _reset(client)
            return
        if f.slowdown:
            f.count("slowdown")
            with contextlib.suppress(OSError):
                client.recv(65536)
                client.sendall(_SLOWDOWN)
            client.close()
            return
        if f.delay:
            time.sleep(f.delay)
        try:
            upstream = socket.create_connection(self.target, timeout=self.connect_timeout)
        except OSError:
            client.close()
            return
        upstream.settimeout(None)  # a store answers a slow body only once all of it arrived
        with self._lock:
            if f.refuse:  # the outage began while this connection was being made
                f.count("refused")
                _reset(client)
                _reset(upstream)
                return
            self._conns.update((client, upstream))
        a = threading.Thread(target=self._pump, args=(client, upstream, True), daemon=True)
        b = threading.Thread(target=self._pump, args=(upstream, client, False), daemon=True)
        a.start()
        b.start()
        a.join()
        b.join()
        with self._lock:
            self._conns.discard(client)
            self._conns.discard(upstream)
        for s in (client, upstream):
            s.close()

    def _throttle(self, n: int, rate: int) -> None:
        with self._lock:
            now = time.monotonic()
            start = max(self._uplink_free_at, now)
            self._uplink_free_at = start + n / rate
            wait = self._uplink_free_at - now
        if wait > 0:
            time.sleep(wait)  # this is the slow link itself, not a test waiting

    def _pump(self, src: socket.socket, dst: socket.socket, upstream: bool) -> None:
        sent = 0
        try:
            while True:
                data = src.recv(65536)
                if not data:
                    break
                f = self.faults
                if upstream and f.reset_after_bytes and sent + len(data) > f.reset_after_bytes:
                    f.count("reset")
                    _reset(src)
                    _reset(dst)
                    return
                if upstream and f.rate:
                    self._throttle(len(data), f.rate)
                dst.sendall(data)
                sent += len(data)
        except OSError:
            pass
        finally:
            if not self.faults.refuse:  # pass the close on; in an outage, outage() resets both
                for s in (src, dst):
                    with contextlib.suppress(OSError):
                        s.shutdown(socket.SHUT_RDWR)


def _reset(s: socket.socket) -> None:
    """Close ``s`` with a reset (RST), also when another thread is blocked reading it: on
    Linux ``close`` alone does not wake that read, and the socket (and the peer's wait for a
    reply) would live on until it returned. ``SHUT_RD`` wakes it without sending anything."""
    with contextlib.suppress(OSError):
        s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, _LINGER_RESET)
        s.shutdown(socket.SHUT_RD)
    s.close()
