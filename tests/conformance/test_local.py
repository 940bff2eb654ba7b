"""``file://`` and ``memory://`` pass the conformance suite."""

from __future__ import annotations

import itertools
import os
import time
from pathlib import Path

import pytest

from sidecar.storage.base import AlreadyExists, Backend
from sidecar.storage.checksum import crc32c_of_bytes
from sidecar.storage.local import TMP_PREFIX, LocalBackend
from sidecar.storage.memory import MemoryBackend
from tests.conformance.suite import BackendConformance

_names = itertools.count()


class TestLocalBackend(BackendConformance):
    @pytest.fixture
    def backend(self, tmp_path: Path) -> Backend:
        return LocalBackend(tmp_path / "dest")

    def test_no_temporary_names_left(self, backend: Backend, tmp_path: Path) -> None:
        backend.put_file("a/b.bin", Path(__file__))
        backend.put_bytes("m.json", b"{}", create_only=True)
        with pytest.raises(AlreadyExists):
            backend.put_bytes("m.json", b"{}", create_only=True)
        left = [p for p in (tmp_path / "dest").rglob("*") if p.name.startswith(TMP_PREFIX)]
        assert left == []

    def test_copy_reports_the_crc32c_of_what_it_copied(self, tmp_path: Path) -> None:
        """A committed object changed in place (same size) on the volume: the copy's CRC32C
        tells, so the pool uploads the file instead of recording a checksum the copy lacks."""
        backend = LocalBackend(tmp_path / "dest")
        data = os.urandom(70_000)
        (tmp_path / "w").write_bytes(data)
        assert backend.put_file("src/w.pt", tmp_path / "w").crc32c == crc32c_of_bytes(data)
        damaged = bytearray(data)
        damaged[500] ^= 0xFF
        (tmp_path / "dest" / "src" / "w.pt").write_bytes(damaged)
        info = backend.copy("src/w.pt", "dst/w.pt")
        assert (info.size, info.crc32c) == (len(data), crc32c_of_bytes(bytes(damaged)))

    def test_stale_temporary_files_swept(self, tmp_path: Path) -> None:
        backend = LocalBackend(tmp_path / "dest")
        stale = tmp_path / "dest" / "x" / f"{TMP_PREFIX}abc"
        stale.parent.mkdir(parents=True)
        stale.write_bytes(b"partial")
        old = time.time() - 7200
        os.utime(stale, (old, old))
        fresh = stale.with_name(f"{TMP_PREFIX}def")
        fresh.write_bytes(b"in flight")
        assert backend.cleanup_stale(3600) == 1  # untouched for over a minute
        assert not stale.exists()
        assert fresh.exists()


class TestMemoryBackend(BackendConformance):
    @pytest.fixture
    def backend(self) -> Backend:
        return MemoryBackend(f"conformance-{next(_names)}")
