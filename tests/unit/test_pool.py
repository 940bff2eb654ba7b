"""The uploader pool: streaming put with CRC32C, re-stat after read, retries, copy, cancel."""

from __future__ import annotations

import errno
import os
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from sidecar.catalog import Catalog
from sidecar.manifest import ManifestFile
from sidecar.metrics import Metrics
from sidecar.model import CheckpointReady, EntryKind, FileEntry
from sidecar.queue import CheckpointQueue
from sidecar.state import StateCache
from sidecar.storage.base import Cancelled, ObjectInfo, PermanentError, Progress, TransientError
from sidecar.storage.checksum import crc32c_of_bytes
from sidecar.storage.memory import MemoryBackend
from sidecar.upload.bandwidth import BandwidthLimiter
from sidecar.upload.beneath import NotBeneath
from sidecar.upload.others import OtherFilesLoop
from sidecar.upload.pool import FileChanged, FileJob, UploaderPool
from sidecar.upload.retry import Backoff
from sidecar.watch.scan import state_of
from tests.unit.test_commit import Recording


class Faulty(Recording):
    """Fails the first ``fail_puts`` put_file calls with ``error``; may touch the file mid-put."""

    def __init__(self, fail_puts: int = 0, error: Exception | None = None) -> None:
        super().__init__(MemoryBackend(f"pool-{uuid.uuid4().hex}"))
        self.fail_puts = fail_puts
        self.error = error or TransientError("503 SlowDown")
        self.touch_during_put: Path | None = None

    def put_file(self, key: str, path: Path, *, progress: Progress | None = None) -> ObjectInfo:
        self._rec("put_file", key)
        if self.fail_puts > 0:
            self.fail_puts -= 1
            raise self.error
        info = self.inner.put_file(key, path, progress=progress)
        if self.touch_during_put is not None:
            with open(self.touch_during_put, "ab") as f:
                f.write(b"appended by the trainer")
        return info


class PoolRig:
    def __init__(self, backend: Recording, root: Path | None = None) -> None:
        self.backend = backend
        self.metrics = Metrics()
        self.cache = StateCache(None)
        self.stop = threading.Event()
        self.pool = UploaderPool(
            backend,
            self.cache,
            self.metrics,
            Backoff(attempts=4, initial=0.001, max_delay=0.005),
            BandwidthLimiter(0),
            3,
            self.stop,
            root=root,
        )

    def metric(self, name: str, labels: dict[str, str] | None = None) -> float:
        return self.metrics.registry.get_sample_value(name, labels or {}) or 0.0


@pytest.fixture
def rig() -> Iterator[PoolRig]:
    r = PoolRig(Faulty())
    yield r
    r.pool.close()


def job(path: Path, key: str, reference: ManifestFile | None = None) -> FileJob:
    return FileJob(FileEntry(path.name, path, state_of(os.lstat(path))), key, reference)


def files(tmp_path: Path, n: int) -> list[Path]:
    out = []
    for i in range(n):
        p = tmp_path / f"f{i}.bin"
        p.write_bytes(bytes([i]) * (1000 * (i + 1)))
        out.append(p)
    return out


def test_uploads_every_file_with_its_crc32c(tmp_path: Path, rig: PoolRig) -> None:
    paths = files(tmp_path, 5)
    results = rig.pool.upload_files([job(p, f"ck/{p.name}") for p in paths], threading.Event())
    by_key = {r.key: r for r in results}
    assert sorted(by_key) == sorted(f"ck/{p.name}" for p in paths)
    for p in paths:
        r = by_key[f"ck/{p.name}"]
        assert (r.size, r.crc32c, r.copied) == (
            p.stat().st_size,
            crc32c_of_bytes(p.read_bytes()),
            False,
        )
        assert rig.backend.get_bytes(r.key) == p.read_bytes()
        assert rig.cache.get(p, state_of(os.lstat(p))) == r.crc32c, "state cache remembers"
    assert (
        rig.metric("ckpt_sidecar_uploaded_files_total", {"backend": "memory", "result": "ok"}) == 5
    )
    assert rig.metric("ckpt_sidecar_in_flight_bytes") == 0


def test_file_changed_before_upload_does_not_count(tmp_path: Path, rig: PoolRig) -> None:
    [p] = files(tmp_path, 1)
    j = job(p, "k")
    p.write_bytes(b"changed since it was judged complete")
    with pytest.raises(FileChanged):
        rig.pool.upload_files([j], threading.Event())
    assert rig.backend.ops("put_file") == []


def test_file_changed_during_upload_does_not_count(tmp_path: Path) -> None:
    backend = Faulty()
    r = PoolRig(backend)
    try:
        [p] = files(tmp_path, 1)
        backend.touch_during_put = p
        with pytest.raises(FileChanged, match="changed while it was uploaded"):
            r.pool.upload_files([job(p, "k")], threading.Event())
        assert (
            r.metric(
                "ckpt_sidecar_uploaded_files_total", {"backend": "memory", "result": "changed"}
            )
            == 1
        )
        assert (
            r.metric("ckpt_sidecar_uploaded_files_total", {"backend": "memory", "result": "ok"})
            == 0
        )
    finally:
        r.pool.close()


def test_transient_errors_are_retried_and_counted(tmp_path: Path) -> None:
    backend = Faulty(fail_puts=2)
    r = PoolRig(backend)
    try:
        [p] = files(tmp_path, 1)
        [res] = r.pool.upload_files([job(p, "k")], threading.Event())
        assert res.crc32c == crc32c_of_bytes(p.read_bytes())
        assert len(backend.ops("put_file")) == 3
        assert (
            r.metric(
                "ckpt_sidecar_retries_total", {"operation": "put_file", "kind": "TransientError"}
            )
            == 2
        )
    finally:
        r.pool.close()


def test_permanent_error_is_raised_not_retried(tmp_path: Path) -> None:
    backend = Faulty(fail_puts=100, error=PermanentError("access denied; grant s3:PutObject"))
    r = PoolRig(backend)
    try:
        paths = files(tmp_path, 3)
        with pytest.raises(PermanentError, match="access denied"):
            r.pool.upload_files([job(p, p.name) for p in paths], threading.Event())
        assert len(backend.ops("put_file")) <= 3
    finally:
        r.pool.close()


class StallsUntilCancelled(Recording):
    """put_file of key ``bad`` fails at once; every other put waits for ``cancel`` (at most
    30 s) and notes whether it came."""

    def __init__(self, cancel: threading.Event) -> None:
        super().__init__(MemoryBackend(f"pool-{uuid.uuid4().hex}"))
        self.cancel = cancel
        self.saw_cancel: list[bool] = []

    def put_file(self, key: str, path: Path, *, progress: Progress | None = None) -> ObjectInfo:
        self._rec("put_file", key)
        if key == "bad":
            raise PermanentError("access denied; grant s3:PutObject")
        self.saw_cancel.append(self.cancel.wait(30))
        raise Cancelled(key)


def test_a_failure_cancels_the_uploads_still_running(tmp_path: Path) -> None:
    """The failing file is the last of the set: the pool must not wait for the ones before
    it to finish on their own before it stops them."""
    cancel = threading.Event()
    backend = StallsUntilCancelled(cancel)
    r = PoolRig(backend)
    try:
        paths = files(tmp_path, 3)
        jobs = [job(paths[0], "a"), job(paths[1], "b"), job(paths[2], "bad")]
        with pytest.raises(PermanentError, match="access denied"):
            r.pool.upload_files(jobs, cancel)
        assert backend.saw_cancel == [True, True]
    finally:
        r.pool.close()


def test_unchanged_file_is_copied_from_the_reference(tmp_path: Path, rig: PoolRig) -> None:
    [p] = files(tmp_path, 1)
    rig.backend.inner.put_file("old/f0.bin", p)
    ref = ManifestFile("f0.bin", "old/f0.bin", p.stat().st_size, crc32c_of_bytes(p.read_bytes()))
    [res] = rig.pool.upload_files([job(p, "new/f0.bin", ref)], threading.Event())
    assert res.copied
    assert rig.backend.ops("copy") == [("copy", "old/f0.bin -> new/f0.bin")]
    assert rig.backend.ops("put_file") == []
    assert rig.backend.get_bytes("new/f0.bin") == p.read_bytes()


def test_failed_copy_falls_back_to_upload(tmp_path: Path, rig: PoolRig) -> None:
    [p] = files(tmp_path, 1)
    ref = ManifestFile("f0.bin", "gone/f0.bin", p.stat().st_size, crc32c_of_bytes(p.read_bytes()))
    [res] = rig.pool.upload_files([job(p, "new/f0.bin", ref)], threading.Event())
    assert not res.copied
    assert [k for _, k in rig.backend.ops("put_file")] == ["new/f0.bin"]
    assert rig.backend.get_bytes("new/f0.bin") == p.read_bytes()


def test_cancel_stops_before_upload(tmp_path: Path, rig: PoolRig) -> None:
    paths = files(tmp_path, 3)
    cancel = threading.Event()
    cancel.set()
    with pytest.raises(Cancelled):
        rig.pool.upload_files([job(p, p.name) for p in paths], cancel)
    assert rig.backend.ops("put_file") == []


def test_vanished_file_raises_file_not_found(tmp_path: Path, rig: PoolRig) -> None:
    [p] = files(tmp_path, 1)
    j = job(p, "k")
    p.unlink()
    with pytest.raises(FileNotFoundError):
        rig.pool.upload_files([j], threading.Event())


# -- never read through a symlink beneath the watch folder -----------------------------------
class SwapsDuringPut(Recording):
    """At the start of each put, replaces ``name`` with a symlink to ``target``."""

    def __init__(self, name: Path, target: Path) -> None:
        super().__init__(MemoryBackend(f"pool-{uuid.uuid4().hex}"))
        self.name, self.target = name, target

    def put_file(self, key: str, path: Path, *, progress: Progress | None = None) -> ObjectInfo:
        self._rec("put_file", key)
        self.name.rename(self.name.with_name("moved-away"))
        self.name.symlink_to(self.target)
        return self.inner.put_file(key, path, progress=progress)


@pytest.fixture
def secret(tmp_path: Path) -> Path:
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "w.pt").write_bytes(b"SECRET outside the watch folder")
    return outside / "w.pt"


def _in_watch(tmp_path: Path, folder: str, data: bytes) -> tuple[Path, Path]:
    """The watch folder and ``<folder>/w.pt`` in it, holding ``data``."""
    root = tmp_path / "watch"
    (root / folder).mkdir(parents=True)
    (root / folder / "w.pt").write_bytes(data)
    return root, root / folder / "w.pt"


def _swap_for_link(root: Path, folder: str, secret: Path) -> None:
    """``folder`` becomes a link to the secret's folder (the same file name behind it)."""
    (root / folder).rename(root / "old")
    (root / folder).symlink_to(secret.parent)


def test_a_folder_swapped_for_a_symlink_after_the_scan_is_not_read_through(
    tmp_path: Path, secret: Path
) -> None:
    root, path = _in_watch(tmp_path, "step_1", b"weights")
    j = job(path, "step_1/w.pt")
    _swap_for_link(root, "step_1", secret)
    r = PoolRig(Faulty(), root=root)
    try:
        with pytest.raises(NotBeneath, match="symlink"):
            r.pool.upload_files([j], threading.Event())
        assert r.backend.ops("put_file") == []
    finally:
        r.pool.close()


def test_a_file_swapped_for_a_symlink_during_the_upload_is_not_read_through(
    tmp_path: Path, secret: Path
) -> None:
    root = tmp_path / "watch"
    root.mkdir()
    (root / "w.pt").write_bytes(b"weights")
    backend = SwapsDuringPut(root / "w.pt", secret)
    r = PoolRig(backend, root=root)
    try:
        with pytest.raises(OSError, match="Too many levels of symbolic links") as e:
            r.pool.upload_files([job(root / "w.pt", "w.pt")], threading.Event())
        assert e.value.filename == str(root / "w.pt"), "the error names the file itself"
        assert [i.key for i in backend.list("")] == [], "read through the swapped-in link"
    finally:
        r.pool.close()


def _others(backend: Faulty, root: Path, **kw: Any) -> OtherFilesLoop:
    """The other-files lane over ``backend`` for the watch folder ``root``."""
    return OtherFilesLoop(
        backend,
        CheckpointQueue(4, 1 << 30),
        Catalog.load(backend),
        Metrics(),
        Backoff(attempts=2, initial=0.001, max_delay=0.005),
        threading.Event(),
        root=root,
        **kw,
    )


def test_an_other_file_under_a_folder_swapped_for_a_symlink_is_not_uploaded(
    tmp_path: Path, secret: Path
) -> None:
    root, path = _in_watch(tmp_path, "logs", b"a log")
    entry = FileEntry("w.pt", path, state_of(os.lstat(path)))
    item = CheckpointReady("logs/w.pt", EntryKind.OTHER, False, (entry,), None, 0.0, 0.0)
    _swap_for_link(root, "logs", secret)
    backend = Faulty()
    failures: list[Exception] = []
    loop = _others(backend, root, on_failure=lambda _, e: failures.append(e))
    loop.upload(item)
    assert backend.ops("put_file") == []
    assert len(failures) == 1 and isinstance(failures[0], NotBeneath)


def test_the_checksum_of_a_file_seen_before_is_read_only_beneath_the_root(
    tmp_path: Path, secret: Path
) -> None:
    """The committer reads a name committed before to compare it: through the same door."""
    root, path = _in_watch(tmp_path, "step_1", b"weights")
    r = PoolRig(Faulty(), root=root)
    try:
        assert r.pool.checksum(path) == crc32c_of_bytes(b"weights")
        _swap_for_link(root, "step_1", secret)
        with pytest.raises(NotBeneath):
            r.pool.checksum(path)
    finally:
        r.pool.close()


def test_other_files_keep_to_the_bandwidth_cap(tmp_path: Path) -> None:
    """Logs and configs go up under ``upload.max_bandwidth_bytes_per_second`` too."""
    root, path = _in_watch(tmp_path, "logs", b"x" * 3000)
    entry = FileEntry("w.pt", path, state_of(os.lstat(path)))
    item = CheckpointReady("logs/w.pt", EntryKind.OTHER, False, (entry,), None, 0.0, 0.0)
    counted: list[int] = []

    class Counting(BandwidthLimiter):
        def consume(self, n: int) -> None:
            counted.append(n)

    backend = Faulty()
    loop = _others(
        backend, root, on_failure=lambda _, e: pytest.fail(f"failed: {e}"), limiter=Counting(1000)
    )
    loop.upload(item)
    assert sum(counted) == 3000


def test_a_read_error_of_an_other_file_names_the_file_not_its_reopened_path(
    tmp_path: Path,
) -> None:
    """Read through its folder's descriptor (/proc/self/fd/N/name), a failing file is still
    named by its own path in the error the operator sees."""
    root, path = _in_watch(tmp_path, "logs", b"a log")
    entry = FileEntry("w.pt", path, state_of(os.lstat(path)))
    item = CheckpointReady("logs/w.pt", EntryKind.OTHER, False, (entry,), None, 0.0, 0.0)

    class Eio(Faulty):
        def put_file(self, key: str, path: Path, *, progress: Progress | None = None) -> Any:
            raise OSError(errno.EIO, "Input/output error", str(path))

    failures: list[Exception] = []
    _others(Eio(), root, on_failure=lambda _, e: failures.append(e)).upload(item)
    assert len(failures) == 1 and isinstance(failures[0], OSError)
    assert failures[0].filename == str(path)
