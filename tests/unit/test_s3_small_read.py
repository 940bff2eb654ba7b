"""A file below the S3 multipart threshold is read into a reused part buffer: exactly its own
bytes go up, with their CRC32C, even when the buffer held a larger file before or the file
grew past the buffer after it was sized (read again, not read on into memory)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from sidecar.storage.base import TransientError
from sidecar.storage.checksum import crc32c_of_bytes
from sidecar.storage.s3 import _read_small


def _read(path: Path, buf: bytearray) -> tuple[bytes, str, list[int]]:
    seen: list[int] = []
    body, crc = _read_small(path, buf, seen.append)
    return bytes(body), crc, seen


def test_a_reused_larger_buffer_gives_only_the_files_bytes(tmp_path: Path) -> None:
    data = os.urandom(1000)
    (tmp_path / "f").write_bytes(data)
    buf = bytearray(b"stale" * 1000)  # what a larger file left in it
    body, crc, seen = _read(tmp_path / "f", buf)
    assert body == data
    assert crc == crc32c_of_bytes(data)
    assert seen == [1000]


def test_a_file_that_grew_past_its_buffer_is_read_again_not_into_memory(tmp_path: Path) -> None:
    """Read on to its end, a file that grew from a few KiB to many GiB would have been held in
    memory whole, outside the part budget; it is sized and read again instead."""
    data = os.urandom(25)
    (tmp_path / "f").write_bytes(data)
    seen: list[int] = []
    with pytest.raises(TransientError, match="grew while it was read"):
        _read_small(tmp_path / "f", bytearray(10), seen.append)  # sized when it was 9 bytes
    assert seen == []
    body, crc, seen = _read(tmp_path / "f", bytearray(26))
    assert (body, crc, seen) == (data, crc32c_of_bytes(data), [25])
