"""Request bodies sent in blocks, so that a socket timeout bounds each block, not the body.

urllib3 sends a ``bytes`` body with one ``sendall``, and a socket timeout bounds a whole
``sendall``. On a new connection that timeout is the *connect* timeout (10 s here), so any
body that took longer to go up failed: an 8 MiB part over a link that gives its connection
less than 0.8 MiB/s was closed, sent again, closed again, and the upload never finished
(bench/drain.md). A file-like body is read and sent in blocks of :data:`BLOCK` bytes, each
with the timeout to itself, so only a connection that stalls for that long fails.

:class:`BytesBody` is that file over bytes already in memory, without copying them;
:class:`BlockwiseAdapter` is a requests adapter that sends every ``bytes`` body through one.
"""

from __future__ import annotations

import os
from typing import Any

from requests import PreparedRequest, Response
from requests.adapters import HTTPAdapter
from urllib3.poolmanager import PoolKey

__all__ = ["BLOCK", "BlockwiseAdapter", "BytesBody"]

#: Bytes per send: botocore's choice for urllib3 2 (16 KiB, urllib3's default, costs CPU).
BLOCK = 128 * 1024


class BytesBody:
    """A read-only, seekable file over ``data``; reads return ``memoryview`` slices of it
    (no copy). ``len()`` is the whole length, so clients send a ``Content-Length``; a retry
    rewinds it with ``seek(0)``."""

    def __init__(self, data: bytes | memoryview) -> None:
        self._view = memoryview(data)
        self._pos = 0

    def __len__(self) -> int:
        return len(self._view)

    def read(self, size: int | None = -1) -> memoryview:
        end = len(self._view) if size is None or size < 0 else self._pos + size
        chunk = self._view[self._pos : end]
        self._pos += len(chunk)
        return chunk

    def seek(self, offset: int, whence: int = os.SEEK_SET) -> int:
        base = {os.SEEK_SET: 0, os.SEEK_CUR: self._pos, os.SEEK_END: len(self._view)}[whence]
        self._pos = min(max(base + offset, 0), len(self._view))
        return self._pos

    def tell(self) -> int:
        return self._pos

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True


class BlockwiseAdapter(HTTPAdapter):
    """A requests adapter that sends ``bytes`` bodies as :class:`BytesBody`, in sends of
    :data:`BLOCK` bytes (where urllib3 takes a block size)."""

    def init_poolmanager(
        self, connections: int, maxsize: int, block: bool = False, **pool_kwargs: Any
    ) -> None:
        if hasattr(PoolKey, "key_blocksize"):  # urllib3 2
            pool_kwargs.setdefault("blocksize", BLOCK)
        super().init_poolmanager(connections, maxsize, block, **pool_kwargs)

    def send(self, request: PreparedRequest, *args: Any, **kwargs: Any) -> Response:
        """Send ``request``; its ``body`` is the same ``bytes`` again afterwards (a redirect
        or a caller that sends it again sees the whole body, not a read-out file)."""
        body = request.body
        if not isinstance(body, bytes):
            return super().send(request, *args, **kwargs)
        request.body = BytesBody(body)  # type: ignore[assignment]
        try:
            return super().send(request, *args, **kwargs)
        finally:
            request.body = body
