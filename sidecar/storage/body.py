"""Request bodies sent in blocks, so that a socket timeout bounds each block, not the body.

urllib3 sends a ``bytes`` body with one ``sendall``, and a socket timeout bounds a whole
``sendall``. On a new connection that timeout is the *connect* timeout (10 s here), so any
body that took longer to go up failed: an 8 MiB part over a link that gives its connection
less than 0.8 MiB/s was closed, sent again, closed again, and the upload never finished
(bench/drain.md). A file-like body is read and sent in blocks of :data:`BLOCK` bytes, each
with the timeout to itself, so only a connection that moves less than a block in that time
fails (1 MiB in 10 s: 100 KiB/s).

:class:`BytesBody` is that file over bytes already in memory, without copying them (the S3
client sends its parts through one); ``sidecar.storage.blockwise`` does the same for the
requests-based clients (GCS, Azure). Nothing here imports requests.
"""

from __future__ import annotations

import os

__all__ = ["BLOCK", "BytesBody"]

#: Bytes per send, on every store; also the block a GCS upload reads from its file and a GCS
#: download reads from its reply, and GCS's one-request limit (``gcs.SIMPLE_MAX``).
#: Larger sends cost less CPU: an S3 upload of 2 GiB in 8 MiB parts spent 0.1 CPU-s/GB
#: less in sends of 1 MiB than of 128 KiB, botocore's size (bench/s3.md); urllib3's own
#: default is 16 KiB.
BLOCK = 1024 * 1024


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
