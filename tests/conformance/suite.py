"""The one conformance suite every storage backend passes.

A backend's test file subclasses :class:`BackendConformance` and supplies a ``backend``
fixture: a fresh, empty destination (its own prefix or bucket) on a real server. Known
server gaps go in ``GAPS`` (test name -> reason), the one place they are declared.
"""

from __future__ import annotations

import concurrent.futures
import os
from pathlib import Path
from typing import ClassVar

import pytest

from sidecar.storage.base import (
    AlreadyExists,
    Backend,
    Cancelled,
    NotFound,
)
from sidecar.storage.checksum import crc32c_of_bytes, crc32c_of_file


def _write(path: Path, data: bytes) -> Path:
    path.write_bytes(data)
    return path


class BackendConformance:
    """Mix-in of tests; subclasses provide the ``backend`` fixture."""

    GAPS: ClassVar[dict[str, str]] = {}
    #: size of the "large" file: the backend fixture must make this at least three parts.
    LARGE_SIZE: ClassVar[int] = 3 * 5 * 1024 * 1024 + 12345

    @pytest.fixture(autouse=True)
    def _declared_gaps(self, request: pytest.FixtureRequest) -> None:
        reason = self.GAPS.get(request.node.originalname)
        if reason:
            pytest.skip(f"declared server gap: {reason}")

    def test_round_trip_with_checksum(self, backend: Backend, tmp_path: Path) -> None:
        data = os.urandom(100_000)
        src = _write(tmp_path / "src.bin", data)
        info = backend.put_file("ckpt/step1/model.pt", src)
        assert info.size == len(data)
        assert info.crc32c == crc32c_of_bytes(data)
        head = backend.head("ckpt/step1/model.pt")
        assert head.size == len(data)
        assert head.crc32c in (None, crc32c_of_bytes(data))
        got = backend.get_file("ckpt/step1/model.pt", tmp_path / "out.bin")
        assert (tmp_path / "out.bin").read_bytes() == data
        assert got.crc32c == crc32c_of_bytes(data)

    def test_empty_file(self, backend: Backend, tmp_path: Path) -> None:
        src = _write(tmp_path / "empty", b"")
        info = backend.put_file("empty.bin", src)
        assert info.size == 0
        assert backend.head("empty.bin").size == 0
        backend.get_file("empty.bin", tmp_path / "out")
        assert (tmp_path / "out").read_bytes() == b""

    def test_multi_part_file(self, backend: Backend, tmp_path: Path) -> None:
        data = os.urandom(self.LARGE_SIZE)
        src = _write(tmp_path / "big.bin", data)
        seen: list[int] = []
        info = backend.put_file("big/shard-0.bin", src, progress=seen.append)
        assert info.size == len(data)
        assert sum(seen) == len(data)
        assert info.crc32c == crc32c_of_file(src)
        backend.get_file("big/shard-0.bin", tmp_path / "back.bin")
        assert crc32c_of_file(tmp_path / "back.bin") == info.crc32c

    def test_overwrite(self, backend: Backend, tmp_path: Path) -> None:
        backend.put_file("k", _write(tmp_path / "a", b"first"))
        backend.put_file("k", _write(tmp_path / "b", b"second version"))
        assert backend.get_bytes("k") == b"second version"
        assert backend.head("k").size == len(b"second version")

    def test_create_only_conflict(self, backend: Backend) -> None:
        backend.put_bytes("m/one.json", b'{"a": 1}', create_only=True)
        with pytest.raises(AlreadyExists):
            backend.put_bytes("m/one.json", b'{"a": 2}', create_only=True)
        assert backend.get_bytes("m/one.json") == b'{"a": 1}'

    def test_create_only_race_has_one_winner(self, backend: Backend) -> None:
        def attempt(i: int) -> bool:
            try:
                backend.put_bytes("race.json", f"writer {i}".encode(), create_only=True)
            except AlreadyExists:
                return False
            return True

        with concurrent.futures.ThreadPoolExecutor(8) as pool:
            wins = list(pool.map(attempt, range(8)))
        assert wins.count(True) == 1
        assert backend.get_bytes("race.json") == f"writer {wins.index(True)}".encode()

    def test_prefix_listing(self, backend: Backend) -> None:
        for key in ("a/1", "a/2", "a/sub/3", "ab/4", "b/5"):
            backend.put_bytes(key, key.encode())
        assert sorted(o.key for o in backend.list("a/")) == ["a/1", "a/2", "a/sub/3"]
        assert sorted(o.key for o in backend.list("a")) == ["a/1", "a/2", "a/sub/3", "ab/4"]
        assert len(list(backend.list(""))) == 5
        assert list(backend.list("nothing/")) == []
        sizes = {o.key: o.size for o in backend.list("b/")}
        assert sizes == {"b/5": 3}

    def test_listing_carries_the_crc32c_where_the_backend_says_so(
        self, backend: Backend, tmp_path: Path
    ) -> None:
        """``lists_crc32c`` lets a check of many objects list once instead of a HEAD each
        (verify, restore): then every listed CRC32C must be what ``head`` reports."""
        big = tmp_path / "big"
        big.write_bytes(os.urandom(self.LARGE_SIZE))
        backend.put_file("crc/big", big)  # in parts where the backend has them
        backend.put_bytes("crc/small", b"small")
        listed = {o.key: o.crc32c for o in backend.list("crc/")}
        assert set(listed) == {"crc/big", "crc/small"}
        if backend.lists_crc32c:
            assert listed == {k: backend.head(k).crc32c for k in listed}
            assert listed["crc/big"] == crc32c_of_file(big)
            assert listed["crc/small"] == crc32c_of_bytes(b"small")

    def test_listing_many(self, backend: Backend) -> None:
        keys = {f"many/{i:04d}" for i in range(1100)}
        with concurrent.futures.ThreadPoolExecutor(8) as pool:
            list(pool.map(lambda k: backend.put_bytes(k, b"x"), keys))
        assert {o.key for o in backend.list("many/")} == keys

    def test_missing_key_errors(self, backend: Backend, tmp_path: Path) -> None:
        with pytest.raises(NotFound):
            backend.head("no/such/key")
        with pytest.raises(NotFound):
            backend.get_bytes("no/such/key")
        with pytest.raises(NotFound):
            backend.get_file("no/such/key", tmp_path / "x")
        with pytest.raises(NotFound):
            backend.copy("no/such/key", "dst")
        backend.delete("no/such/key")  # deleting a missing key is fine

    def test_delete(self, backend: Backend) -> None:
        backend.put_bytes("d/1", b"1")
        backend.delete("d/1")
        with pytest.raises(NotFound):
            backend.head("d/1")
        assert list(backend.list("d/")) == []

    def test_unicode_and_space_in_keys(self, backend: Backend, tmp_path: Path) -> None:
        key = "run 1/chéckpoint ü/模型 shard+1=2.pt"
        backend.put_file(key, _write(tmp_path / "u", b"unicode"))
        assert backend.get_bytes(key) == b"unicode"
        assert [o.key for o in backend.list("run 1/")] == [key]

    def test_concurrent_puts(self, backend: Backend, tmp_path: Path) -> None:
        files = {f"c/{i}.bin": os.urandom(50_000 + i) for i in range(16)}
        for key, data in files.items():
            _write(tmp_path / key.replace("/", "_"), data)

        def put(key: str) -> str | None:
            return backend.put_file(key, tmp_path / key.replace("/", "_")).crc32c

        with concurrent.futures.ThreadPoolExecutor(8) as pool:
            crcs = dict(zip(files, pool.map(put, files), strict=True))
        for key, data in files.items():
            assert crcs[key] == crc32c_of_bytes(data)
            assert backend.get_bytes(key) == data

    def test_copy(self, backend: Backend, tmp_path: Path) -> None:
        data = os.urandom(70_000)
        backend.put_file("src/w.pt", _write(tmp_path / "w", data))
        info = backend.copy("src/w.pt", "dst/w.pt")
        assert info.size == len(data)
        assert info.crc32c in (None, crc32c_of_bytes(data)), "a CRC32C given is the copy's"
        assert backend.get_bytes("dst/w.pt") == data
        assert backend.get_bytes("src/w.pt") == data

    def test_interrupted_put_leaves_nothing(self, backend: Backend, tmp_path: Path) -> None:
        src = _write(tmp_path / "big.bin", os.urandom(self.LARGE_SIZE))
        sent = 0

        def cancel_midway(n: int) -> None:
            nonlocal sent
            sent += n
            if sent > self.LARGE_SIZE // 3:
                raise Cancelled("test cancels")

        with pytest.raises(Cancelled):
            backend.put_file("half/model.pt", src, progress=cancel_midway)
        with pytest.raises(NotFound):
            backend.head("half/model.pt")
        assert list(backend.list("half/")) == []

    def test_interrupted_overwrite_keeps_old(self, backend: Backend, tmp_path: Path) -> None:
        backend.put_bytes("keep.bin", b"old")
        src = _write(tmp_path / "big.bin", os.urandom(self.LARGE_SIZE))

        def cancel(n: int) -> None:
            raise Cancelled("test cancels")

        with pytest.raises(Cancelled):
            backend.put_file("keep.bin", src, progress=cancel)
        assert backend.get_bytes("keep.bin") == b"old"

    def test_unreadable_source_raises_oserror(self, backend: Backend, tmp_path: Path) -> None:
        with pytest.raises(OSError):
            backend.put_file("x.bin", tmp_path / "does-not-exist")
        with pytest.raises(NotFound):
            backend.head("x.bin")
