"""An endpoint that drops connection attempts, as a firewall that silently discards packets
does: a loopback listener whose accept queue is full, so the kernel ignores further SYNs
and ``connect()`` hangs until the client's own timeout (or the kernel's, about 127 s)."""

from __future__ import annotations

import contextlib
import socket
from collections.abc import Iterator

__all__ = ["blackhole"]


@contextlib.contextmanager
def blackhole() -> Iterator[str]:
    """Yield ``http://127.0.0.1:<port>`` whose connections never complete."""
    listener = socket.socket()
    fillers: list[socket.socket] = []
    try:
        listener.bind(("127.0.0.1", 0))
        listener.listen(0)
        port = listener.getsockname()[1]
        # Connections that complete fill the queue; the first one that does not proves it full.
        for _ in range(16):
            s = socket.socket()
            fillers.append(s)
            s.settimeout(0.5)
            try:
                s.connect(("127.0.0.1", port))
            except TimeoutError:
                break
            except OSError as e:  # pragma: no cover - the kernel refused instead of dropping
                raise RuntimeError(f"loopback connect failed: {e}") from e
        else:  # pragma: no cover
            raise RuntimeError("the accept queue never filled: cannot make a black hole")
        yield f"http://127.0.0.1:{port}"
    finally:
        for s in fillers:
            s.close()
        listener.close()
