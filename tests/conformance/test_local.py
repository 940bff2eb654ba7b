"""``file://`` and ``memory://`` pass the conformance suite."""

from __future__ import annotations

import errno
import itertools
import os
import time
from pathlib import Path

import pytest

from sidecar import atomic_write
from sidecar.atomic_write import fsync_path
from sidecar.storage.base import AlreadyExists, Backend, PermanentError
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

    def test_a_mount_without_hard_links_is_a_permanent_error_naming_it(
        self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """gcsfuse, blobfuse2, mountpoint-s3 and some SMB shares answer link(2) with EPERM or
        ENOTSUP: manifests can never be written there, and the message says why."""
        backend = LocalBackend(tmp_path / "dest")

        def no_links(src: object, dst: object) -> None:
            raise OSError(errno.EPERM, "Operation not permitted")

        def no_deletes(path: Path, missing_ok: bool = False) -> None:
            raise PermissionError(errno.EPERM, "Operation not permitted", str(path))

        monkeypatch.setattr(os, "link", no_links)
        monkeypatch.setattr(Path, "unlink", no_deletes)  # mountpoint-s3 without --allow-delete
        with pytest.raises(PermanentError, match="makes no hard links"):
            backend.check()  # told at start, as this error, whatever the clean-up meets
        monkeypatch.undo()
        monkeypatch.setattr(os, "link", no_links)
        for leftover in (tmp_path / "dest").iterdir():
            leftover.unlink()
        with pytest.raises(PermanentError, match="makes no hard links") as err:
            backend.put_bytes("m.json", b"{}", create_only=True)
        assert "read-write" not in str(err.value)
        assert list((tmp_path / "dest").iterdir()) == []
        monkeypatch.undo()
        backend.check()
        assert list((tmp_path / "dest").iterdir()) == [], "the probe leaves nothing"

    def test_a_mount_that_cannot_sync_a_folder_still_takes_writes(
        self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """Some FUSE and SMB mounts answer fsync(2) of a folder with EINVAL: the object is in
        place and the write counts, instead of failing every time after the rename."""
        backend = LocalBackend(tmp_path / "dest")
        real = fsync_path

        def files_only(path: Path) -> None:
            if path.is_dir():
                raise OSError(errno.EINVAL, "Invalid argument")
            real(path)

        monkeypatch.setattr(atomic_write, "fsync_path", files_only)
        (tmp_path / "w").write_bytes(b"weights")
        assert backend.put_file("a/b/w.pt", tmp_path / "w").size == 7
        backend.put_bytes("m.json", b"{}", create_only=True)
        assert backend.get_bytes("a/b/w.pt") == b"weights"

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
