"""``file://`` and ``memory://`` pass the conformance suite."""

from __future__ import annotations

import itertools
import os
import time
from pathlib import Path

import pytest

from sidecar.storage.base import AlreadyExists, Backend
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
