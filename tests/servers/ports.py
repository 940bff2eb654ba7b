"""Loopback helpers shared by the local servers the tests and benchmarks start."""

from __future__ import annotations

import socket
import urllib.error
import urllib.request

__all__ = ["answers", "free_port"]


def free_port() -> int:
    """A TCP port free on 127.0.0.1 right now (a server started next may take it)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def answers(url: str, timeout: float = 1.0) -> bool:
    """Whether an HTTP server answers ``url`` at all (any status, even 400/403 for an
    unsigned request, counts), bypassing any proxy from the environment."""
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    try:
        with opener.open(url, timeout=timeout):
            return True
    except urllib.error.HTTPError:
        return True
    except OSError:
        return False
