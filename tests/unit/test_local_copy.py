"""``copy_with_crc``: the copy and its CRC32C always describe the same bytes."""

from __future__ import annotations

import errno
import os
import subprocess
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from sidecar.storage.checksum import crc32c_of_bytes, crc32c_of_file
from sidecar.storage.local import LocalBackend
from sidecar.storage.local_copy import COPY_CHUNK, WRITE_BEHIND, WriteError, copy_with_crc


def _data(n: int) -> bytes:
    return os.urandom(n)


@pytest.fixture
def paths(tmp_path: Path) -> tuple[Path, Path]:
    return tmp_path / "src.bin", tmp_path / "dst.bin"


def _copy(
    src: Path, dst: Path, flags: int = 0, progress: Callable[[int], None] | None = None
) -> tuple[int, str]:
    s = os.open(src, os.O_RDONLY)
    d = os.open(dst, os.O_RDWR | os.O_CREAT | os.O_EXCL | flags, 0o644)
    try:
        size, crc = copy_with_crc(s, d, progress=progress)
    finally:
        os.close(s)
        os.close(d)
    return size, crc.b64()


@pytest.mark.parametrize("size", [0, 1, COPY_CHUNK - 1, COPY_CHUNK, 3 * COPY_CHUNK + 17])
def test_copy_is_exact_and_its_crc_is_the_files(paths: tuple[Path, Path], size: int) -> None:
    src, dst = paths
    src.write_bytes(_data(size))
    seen: list[int] = []
    got = _copy(src, dst, progress=seen.append)
    assert dst.read_bytes() == src.read_bytes()
    assert got == (size, crc32c_of_file(src))
    assert sum(seen) == size


def test_without_the_in_kernel_copy_the_result_is_the_same(paths: tuple[Path, Path]) -> None:
    """sendfile(2) refuses a destination opened for appending (EINVAL): the copy goes
    through the buffer instead, with the same bytes and checksum."""
    src, dst = paths
    src.write_bytes(_data(2 * COPY_CHUNK + 5))
    got = _copy(src, dst, os.O_APPEND)
    assert dst.read_bytes() == src.read_bytes()
    assert got == (src.stat().st_size, crc32c_of_file(src))


def test_a_source_cut_short_during_the_copy_gives_a_matching_crc(
    paths: tuple[Path, Path],
) -> None:
    src, dst = paths
    src.write_bytes(_data(4 * COPY_CHUNK))

    def cut(_: int) -> None:
        os.truncate(src, COPY_CHUNK + 100)

    size, crc = _copy(src, dst, progress=cut)
    held = dst.read_bytes()
    assert size == len(held) == COPY_CHUNK + 100
    assert crc == crc32c_of_bytes(held)


def test_a_source_rewritten_during_the_copy_gives_a_matching_crc(
    paths: tuple[Path, Path],
) -> None:
    src, dst = paths
    src.write_bytes(b"a" * (3 * COPY_CHUNK))

    def rewrite(_: int) -> None:
        with open(src, "r+b") as f:
            f.write(b"b" * (3 * COPY_CHUNK))

    _, crc = _copy(src, dst, progress=rewrite)
    held = dst.read_bytes()
    assert held[:COPY_CHUNK] == b"a" * COPY_CHUNK and held[COPY_CHUNK:] == b"b" * 2 * COPY_CHUNK
    assert crc == crc32c_of_bytes(held)


def _copy_error(src: Path | str, dst: Path | str, dst_flags: int) -> OSError:
    """The OSError that copying ``src`` into ``dst`` (opened with ``dst_flags``) raises."""
    s = os.open(src, os.O_RDONLY)
    d = os.open(dst, dst_flags, 0o644)
    try:
        with pytest.raises(OSError) as e:
            copy_with_crc(s, d)
    finally:
        os.close(s)
        os.close(d)
    return e.value


def test_a_full_destination_is_a_write_error(tmp_path: Path) -> None:
    src = tmp_path / "src.bin"
    src.write_bytes(_data(COPY_CHUNK))
    err = _copy_error(src, "/dev/full", os.O_RDWR)
    assert isinstance(err, WriteError)
    assert err.errno == errno.ENOSPC


def test_an_unreadable_source_is_not_a_write_error(tmp_path: Path) -> None:
    # a folder: neither sendfile nor pread can read it
    err = _copy_error(tmp_path, tmp_path / "dst.bin", os.O_RDWR | os.O_CREAT)
    assert not isinstance(err, WriteError)
    assert err.errno == errno.EISDIR


def _resident(path: Path) -> int:
    """Bytes of ``path`` in the page cache, read with util-linux ``fincore`` (mincore(2)),
    which leaves the cache as it is. A read with ``RWF_NOWAIT`` is no such probe: it
    starts read-ahead, and when the disk answers at once it returns the page it just read
    (seen once in 300 runs, and in CI)."""
    out = subprocess.run(
        ["fincore", "--bytes", "--noheadings", "--output", "RES", str(path)],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    return int(out)


def test_put_file_leaves_no_second_image_in_the_page_cache(tmp_path: Path) -> None:
    """A 10 GiB checkpoint copied to a mounted volume must not leave 10 GiB of the daemon's
    page cache behind (charged to its memory cgroup): the copy is written back as it goes
    and its pages are dropped once it is durable. The trainer's own file is left alone."""
    src = tmp_path / "model.pt"
    src.write_bytes(_data(3 * WRITE_BEHIND + 5))
    LocalBackend(tmp_path / "dest").put_file("step_1/model.pt", src)
    copy = tmp_path / "dest" / "step_1" / "model.pt"
    assert _resident(copy) == 0
    assert _resident(src) >= src.stat().st_size  # left in the cache, whole
    assert copy.read_bytes() == src.read_bytes()


def test_copies_on_several_threads_at_once_stay_apart(tmp_path: Path) -> None:
    """The uploader pool copies several files at once; each thread's copy and CRC are its own."""
    sources = []
    for i in range(16):
        p = tmp_path / f"src{i}.bin"
        p.write_bytes(_data(8 * COPY_CHUNK + 1000 * i))
        sources.append(p)

    def one(p: Path) -> tuple[int, str]:
        return _copy(p, p.with_suffix(".copy"))

    with ThreadPoolExecutor(4) as pool:
        results = list(pool.map(one, sources))
    for p, got in zip(sources, results, strict=True):
        assert p.with_suffix(".copy").read_bytes() == p.read_bytes()
        assert got == (p.stat().st_size, crc32c_of_file(p))
