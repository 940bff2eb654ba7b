"""A download in ranges fetched in parallel: bytes at their offsets, one CRC32C, failures."""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from sidecar.storage.base import PermanentError, TransientError
from sidecar.storage.checksum import crc32c_of_bytes
from sidecar.storage.ranges import download_in_ranges

RANGE = 1000


def pieces(data: bytes, first: int, last: int, size: int = 7) -> Iterator[bytes]:
    for i in range(first, last + 1, size):
        yield data[i : min(i + size, last + 1)]


def test_every_range_lands_at_its_offset_under_one_crc32c(tmp_path: Path) -> None:
    data = os.urandom(10 * RANGE + 3)
    seen: list[int] = []
    lock = threading.Lock()

    def progress(n: int) -> None:
        with lock:
            seen.append(n)

    with ThreadPoolExecutor(4) as pool:
        crc = download_in_ranges(
            lambda a, b: pieces(data, a, b), tmp_path / "f", len(data), RANGE, pool, progress
        )
    assert (tmp_path / "f").read_bytes() == data
    assert crc == crc32c_of_bytes(data)
    assert sum(seen) == len(data)


def test_a_range_that_ends_short_fails_and_leaves_no_file(tmp_path: Path) -> None:
    data = os.urandom(5 * RANGE)

    def short_third(a: int, b: int) -> Iterator[bytes]:
        return pieces(data, a, b - 1 if a == 2 * RANGE else b)

    with ThreadPoolExecutor(4) as pool, pytest.raises(TransientError, match="ended after 999"):
        download_in_ranges(short_third, tmp_path / "f", len(data), RANGE, pool)
    assert not (tmp_path / "f").exists()


def test_the_first_failure_is_raised_not_the_stop_of_the_others(tmp_path: Path) -> None:
    data = os.urandom(8 * RANGE)
    failed = threading.Event()

    def read(a: int, b: int) -> Iterator[bytes]:
        if a == 3 * RANGE:
            failed.set()
            raise PermanentError("access denied; grant s3:GetObject")
        failed.wait(10)  # the others go on only once one range has failed
        return pieces(data, a, b)

    with ThreadPoolExecutor(4) as pool, pytest.raises(PermanentError, match="access denied"):
        download_in_ranges(read, tmp_path / "f", len(data), RANGE, pool)
    assert not (tmp_path / "f").exists()
