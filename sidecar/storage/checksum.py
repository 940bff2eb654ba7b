"""CRC32C in the form the stores print it (base64 of 4 big-endian bytes)."""

from __future__ import annotations

import base64
from collections.abc import Iterator
from pathlib import Path
from typing import Any, BinaryIO

import google_crc32c as _google_crc32c

__all__ = ["CHUNK", "Crc32c", "crc32c_of_bytes", "crc32c_of_file", "read_chunks"]

CHUNK = 1024 * 1024
_gc: Any = _google_crc32c  # the package's functions carry no annotations


class Crc32c:
    """An incremental CRC32C. ``update`` takes bytes (not a memoryview)."""

    def __init__(self) -> None:
        self._c = _gc.Checksum()

    def update(self, data: bytes) -> None:
        self._c.update(data)

    def b64(self) -> str:
        return base64.b64encode(self._c.digest()).decode("ascii")

    def value(self) -> int:
        return int.from_bytes(self._c.digest(), "big")


def read_chunks(f: BinaryIO, size: int = CHUNK) -> Iterator[bytes]:
    """Yield the rest of ``f`` in chunks of at most ``size`` bytes."""
    while chunk := f.read(size):
        yield chunk


def crc32c_of_bytes(data: bytes) -> str:
    c = Crc32c()
    c.update(data)
    return c.b64()


def crc32c_of_file(path: Path) -> str:
    """Read ``path`` once, streaming. Raises ``OSError``."""
    c = Crc32c()
    with open(path, "rb") as f:
        for chunk in read_chunks(f):
            c.update(chunk)
    return c.b64()
