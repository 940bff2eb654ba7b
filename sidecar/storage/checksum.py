"""CRC32C in the form the stores print it (base64 of 4 big-endian bytes).

Computed by awscrt's native CRC32C (hardware instructions where the CPU has them; about
twice the speed of google-crc32c here, bench/s3.md), which also combines the CRCs of two
adjacent pieces without reading either again.
"""

from __future__ import annotations

import base64
from collections.abc import Iterator
from pathlib import Path
from typing import BinaryIO, TypeAlias

from awscrt import checksums as _crt

from sidecar.storage.source import open_source

__all__ = ["CHUNK", "Crc32c", "crc32c_of_bytes", "crc32c_of_file", "read_chunks"]

CHUNK = 1024 * 1024
Buffer: TypeAlias = bytes | bytearray | memoryview


class Crc32c:
    """An incremental CRC32C of a byte stream."""

    def __init__(self) -> None:
        self._v = 0

    def update(self, data: Buffer) -> None:
        """Append ``data`` (bytes, bytearray or memoryview) to the stream."""
        self._v = _crt.crc32c(data, self._v)

    def extend(self, crc: int, length: int) -> None:
        """Append a piece of ``length`` bytes whose own CRC32C is ``crc``, without its bytes."""
        self._v = _crt.combine_crc32c(self._v, crc, length)

    def b64(self) -> str:
        return base64.b64encode(self._v.to_bytes(4, "big")).decode("ascii")

    def value(self) -> int:
        return self._v


def read_chunks(f: BinaryIO, size: int = CHUNK) -> Iterator[bytes]:
    """Yield the rest of ``f`` in chunks of at most ``size`` bytes."""
    while chunk := f.read(size):
        yield chunk


def crc32c_of_bytes(data: Buffer) -> str:
    c = Crc32c()
    c.update(data)
    return c.b64()


def crc32c_of_file(path: Path) -> str:
    """Read ``path`` once, streaming. Raises ``OSError``."""
    c = Crc32c()
    with open_source(path) as f:
        for chunk in read_chunks(f):
            c.update(chunk)
    return c.b64()
