"""Committer on real backends (memory, file://): generations, write-last, copies, conflicts.

The helpers here (``Recording``, ``Rig``, ``ready``) are reused by the retention, restore
and pool tests.
"""

from __future__ import annotations

import json
import os
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from structlog.testing import capture_logs

from sidecar.catalog import Catalog
from sidecar.checks import VerifyFailed, verify_manifest
from sidecar.commit import Committer, Outcome
from sidecar.manifest import LATEST_KEY, Manifest, manifest_key, parse
from sidecar.metrics import Metrics
from sidecar.model import CheckpointReady, EntryKind, FileEntry
from sidecar.retention import Retention
from sidecar.state import StateCache
from sidecar.storage.base import Backend, ObjectInfo, Progress
from sidecar.storage.checksum import crc32c_of_bytes
from sidecar.storage.local import LocalBackend
from sidecar.storage.memory import MemoryBackend
from sidecar.upload.bandwidth import BandwidthLimiter
from sidecar.upload.pool import FileChanged, UploaderPool
from sidecar.upload.retry import Backoff
from sidecar.watch.layouts import step_of
from sidecar.watch.scan import scan_entry


class Recording(Backend):
    """A real backend with every call recorded in order as ``(operation, key)``."""

    def __init__(self, inner: Backend) -> None:
        self.inner = inner
        self.scheme = inner.scheme
        self.lists_crc32c = inner.lists_crc32c
        self.calls: list[tuple[str, str]] = []
        self.lock = threading.Lock()

    def _rec(self, op: str, key: str) -> None:
        with self.lock:
            self.calls.append((op, key))

    def ops(self, *names: str) -> list[tuple[str, str]]:
        with self.lock:
            return [c for c in self.calls if c[0] in names]

    def clear(self) -> None:
        with self.lock:
            self.calls.clear()

    @property
    def url(self) -> str:
        return self.inner.url

    def put_file(self, key: str, path: Path, *, progress: Progress | None = None) -> ObjectInfo:
        self._rec("put_file", key)
        return self.inner.put_file(key, path, progress=progress)

    def put_bytes(self, key: str, data: bytes, *, create_only: bool = False) -> ObjectInfo:
        self._rec("put_bytes_create_only" if create_only else "put_bytes", key)
        return self.inner.put_bytes(key, data, create_only=create_only)

    def get_file(self, key: str, path: Path, *, progress: Progress | None = None) -> ObjectInfo:
        self._rec("get_file", key)
        return self.inner.get_file(key, path, progress=progress)

    def get_bytes(self, key: str) -> bytes:
        self._rec("get_bytes", key)
        return self.inner.get_bytes(key)

    def head(self, key: str) -> ObjectInfo:
        self._rec("head", key)
        return self.inner.head(key)

    def list(self, prefix: str = "") -> Iterator[ObjectInfo]:
        self._rec("list", prefix)
        return self.inner.list(prefix)

    def delete(self, key: str) -> None:
        self._rec("delete", key)
        self.inner.delete(key)

    def copy(self, src: str, dst: str) -> ObjectInfo:
        self._rec("copy", f"{src} -> {dst}")
        return self.inner.copy(src, dst)


def ready(root: Path, name: str, layout: str = "plain") -> CheckpointReady:
    """What the watcher hands off for ``root/name`` right now."""
    path = root / name
    snap = scan_entry(path)
    assert snap is not None
    is_dir = path.is_dir()
    files = tuple(
        FileEntry(rel=rel, path=path / rel if is_dir else path, state=st)
        for rel, st in sorted(snap.items())
    )
    return CheckpointReady(
        name=name,
        kind=EntryKind.CHECKPOINT,
        is_dir=is_dir,
        files=files,
        step=step_of(name),
        completed_at=time.time(),
        completed_mono=time.monotonic(),
        layout=layout,
    )


class Rig:
    """A committer wired like the daemon wires it, on ``backend``."""

    def __init__(
        self,
        backend: Backend,
        *,
        keep_last: int = 100,
        keep_every: int = 0,
        catalog: Catalog | None = None,
    ) -> None:
        self.backend = backend
        self.metrics = Metrics()
        self.stop = threading.Event()
        self.cache = StateCache(None)
        self.catalog = catalog if catalog is not None else Catalog.load(backend)
        backoff = Backoff(attempts=3, initial=0.001, max_delay=0.01)
        self.pool = UploaderPool(
            backend, self.cache, self.metrics, backoff, BandwidthLimiter(0), 4, self.stop
        )
        self.committer = Committer(
            backend,
            self.catalog,
            self.pool,
            self.cache,
            Retention(backend, keep_last, keep_every),
            self.metrics,
            backoff,
            self.stop,
        )

    def commit(self, item: CheckpointReady) -> Outcome:
        return self.committer.commit(item, threading.Event())

    def metric(self, name: str, labels: dict[str, str] | None = None) -> float:
        v = self.metrics.registry.get_sample_value(name, labels or {})
        return 0.0 if v is None else v

    def close(self) -> None:
        self.pool.close()


@pytest.fixture(params=["memory", "file"])
def backend(request: pytest.FixtureRequest, tmp_path: Path) -> Recording:
    if request.param == "memory":
        return Recording(MemoryBackend(f"test-{uuid.uuid4().hex}"))
    return Recording(LocalBackend(tmp_path / "remote"))


@pytest.fixture
def rigs() -> Iterator[list[Rig]]:
    made: list[Rig] = []
    yield made
    for r in made:
        r.close()


def new_rig(rigs: list[Rig], backend: Backend, **kw: int) -> Rig:
    r = Rig(backend, **kw)  # type: ignore[arg-type]
    rigs.append(r)
    return r


def manifest_at(backend: Backend, key: str) -> Manifest:
    return parse(backend.get_bytes(key), where=key)


def obj(backend: Backend, key: str, tmp: Path) -> bytes:
    dest = tmp / f"dl-{uuid.uuid4().hex}"
    backend.get_file(key, dest)
    return dest.read_bytes()


# -- first commit --------------------------------------------------------------------------
def test_first_commit_is_generation_0_with_manifest_written_last(
    tmp_path: Path, backend: Recording, rigs: list[Rig]
) -> None:
    src = tmp_path / "ckpts"
    (src / "step_100" / "sub").mkdir(parents=True)
    (src / "step_100" / "model.pt").write_bytes(b"m" * 3000)
    (src / "step_100" / "sub" / "optim.pt").write_bytes(b"o" * 17)
    rig = new_rig(rigs, backend)
    backend.clear()
    assert rig.commit(ready(src, "step_100")) is Outcome.COMMITTED

    writes = backend.ops("put_file", "copy", "put_bytes", "put_bytes_create_only")
    mkey = manifest_key("step_100", 0)
    assert mkey == ".ckpt-sidecar/manifests/step_100.json"
    assert writes[-2] == ("put_bytes_create_only", mkey), "the manifest is written last"
    assert writes[-1] == ("put_bytes", LATEST_KEY)
    assert sorted(k for op, k in writes[:-2]) == ["step_100/model.pt", "step_100/sub/optim.pt"]

    m = manifest_at(backend, mkey)
    assert (m.name, m.generation, m.step, m.is_dir, m.layout) == ("step_100", 0, 100, True, "plain")
    assert {(f.path, f.key, f.size, f.crc32c) for f in m.files} == {
        ("model.pt", "step_100/model.pt", 3000, crc32c_of_bytes(b"m" * 3000)),
        ("sub/optim.pt", "step_100/sub/optim.pt", 17, crc32c_of_bytes(b"o" * 17)),
    }
    assert obj(backend, "step_100/sub/optim.pt", tmp_path) == b"o" * 17
    raw = json.loads(backend.get_bytes(mkey))
    assert raw["format"] == 1 and raw["host"] and raw["sidecar_version"]
    assert raw["committed_at"].endswith("Z") and raw["completed_at"].endswith("Z")
    latest = json.loads(backend.get_bytes(LATEST_KEY))
    assert latest["manifest"] == mkey and latest["step"] == 100
    assert rig.metric("ckpt_sidecar_checkpoints_committed_total") == 1
    assert rig.metric("ckpt_sidecar_last_committed_step") == 100


def test_single_file_checkpoint_key_is_its_name(
    tmp_path: Path, backend: Recording, rigs: list[Rig]
) -> None:
    (tmp_path / "ckpt_7.pt").write_bytes(b"seven")
    rig = new_rig(rigs, backend)
    assert rig.commit(ready(tmp_path, "ckpt_7.pt")) is Outcome.COMMITTED
    m = manifest_at(backend, manifest_key("ckpt_7.pt", 0))
    assert not m.is_dir
    assert [(f.path, f.key) for f in m.files] == [("ckpt_7.pt", "ckpt_7.pt")]
    assert obj(backend, "ckpt_7.pt", tmp_path) == b"seven"


def test_same_content_again_is_already_committed_and_writes_nothing(
    tmp_path: Path, backend: Recording, rigs: list[Rig]
) -> None:
    p = tmp_path / "last.ckpt"
    p.write_bytes(b"v1")
    rig = new_rig(rigs, backend)
    assert rig.commit(ready(tmp_path, "last.ckpt")) is Outcome.COMMITTED
    p.write_bytes(b"v1")  # rewritten with identical bytes: new mtime, same content
    backend.clear()
    with capture_logs() as logs:
        assert rig.commit(ready(tmp_path, "last.ckpt")) is Outcome.ALREADY
    assert backend.ops("put_file", "copy", "put_bytes", "put_bytes_create_only", "delete") == []
    assert any(e["event"] == "checkpoint.already_committed" for e in logs)


def test_changed_content_under_same_name_is_a_new_generation(
    tmp_path: Path, backend: Recording, rigs: list[Rig]
) -> None:
    d = tmp_path / "checkpoint"
    d.mkdir()
    (d / "w.bin").write_bytes(b"first")
    rig = new_rig(rigs, backend)
    assert rig.commit(ready(tmp_path, "checkpoint")) is Outcome.COMMITTED
    (d / "w.bin").write_bytes(b"second!")
    backend.clear()
    assert rig.commit(ready(tmp_path, "checkpoint")) is Outcome.COMMITTED

    puts = [k for _, k in backend.ops("put_file")]
    assert puts == ["checkpoint@g1/w.bin"]
    assert ("checkpoint/w.bin") not in puts, "a committed object is never written over"
    g1 = manifest_at(backend, manifest_key("checkpoint", 1))
    assert g1.key == ".ckpt-sidecar/manifests/checkpoint@g1.json"
    assert [(f.path, f.key) for f in g1.files] == [("w.bin", "checkpoint@g1/w.bin")]
    assert obj(backend, "checkpoint/w.bin", tmp_path) == b"first"
    assert obj(backend, "checkpoint@g1/w.bin", tmp_path) == b"second!"
    g0 = manifest_at(backend, manifest_key("checkpoint", 0))
    assert g1.sequence > g0.sequence
    verify_manifest(backend, g0, deep=True, tmp_dir=tmp_path)


def test_unchanged_file_is_copied_server_side_not_uploaded(
    tmp_path: Path, backend: Recording, rigs: list[Rig]
) -> None:
    big = b"embedding" * 5000
    for step, opt in ((1, b"opt-1"), (2, b"opt-2")):
        d = tmp_path / f"step_{step}"
        d.mkdir()
        (d / "embed.pt").write_bytes(big)
        (d / "optim.pt").write_bytes(opt)
    rig = new_rig(rigs, backend)
    rig.commit(ready(tmp_path, "step_1"))
    backend.clear()
    assert rig.commit(ready(tmp_path, "step_2")) is Outcome.COMMITTED
    assert backend.ops("copy") == [("copy", "step_1/embed.pt -> step_2/embed.pt")]
    assert [k for _, k in backend.ops("put_file")] == ["step_2/optim.pt"]
    m = manifest_at(backend, manifest_key("step_2", 0))
    by_path = {f.path: f for f in m.files}
    assert by_path["embed.pt"].key == "step_2/embed.pt"
    assert by_path["embed.pt"].crc32c == crc32c_of_bytes(big)
    assert obj(backend, "step_2/embed.pt", tmp_path) == big
    assert rig.metric("ckpt_sidecar_server_side_copy_saved_bytes_total") == len(big)
    verify_manifest(backend, m, deep=True, tmp_dir=tmp_path)


def test_same_size_different_bytes_is_uploaded_not_copied(
    tmp_path: Path, backend: Recording, rigs: list[Rig]
) -> None:
    for step, data in ((1, b"AAAA"), (2, b"BBBB")):
        (tmp_path / f"step_{step}").mkdir()
        (tmp_path / f"step_{step}" / "w.pt").write_bytes(data)
    rig = new_rig(rigs, backend)
    rig.commit(ready(tmp_path, "step_1"))
    backend.clear()
    rig.commit(ready(tmp_path, "step_2"))
    assert backend.ops("copy") == []
    assert obj(backend, "step_2/w.pt", tmp_path) == b"BBBB"


def test_sequence_increases_per_destination(
    tmp_path: Path, backend: Recording, rigs: list[Rig]
) -> None:
    rig = new_rig(rigs, backend)
    seqs = []
    for n in ("a.pt", "b.pt", "c.pt"):
        (tmp_path / n).write_bytes(n.encode())
        rig.commit(ready(tmp_path, n))
        seqs.append(manifest_at(backend, manifest_key(n, 0)).sequence)
    assert seqs == sorted(seqs) and len(set(seqs)) == 3
    # a restarted daemon (fresh catalog from the destination) continues the sequence
    rig2 = new_rig(rigs, backend)
    (tmp_path / "d.pt").write_bytes(b"d")
    rig2.commit(ready(tmp_path, "d.pt"))
    assert manifest_at(backend, manifest_key("d.pt", 0)).sequence > seqs[-1]


def test_lower_step_than_newest_is_committed_with_a_warning(
    tmp_path: Path, backend: Recording, rigs: list[Rig]
) -> None:
    for n in ("ckpt_500.pt", "ckpt_20.pt"):
        (tmp_path / n).write_bytes(n.encode())
    rig = new_rig(rigs, backend)
    rig.commit(ready(tmp_path, "ckpt_500.pt"))
    with capture_logs() as logs:
        assert rig.commit(ready(tmp_path, "ckpt_20.pt")) is Outcome.COMMITTED
    warn = [e for e in logs if e["event"] == "checkpoint.step_lower_than_committed"]
    assert warn and warn[0]["step"] == 20 and warn[0]["newest_step"] == 500


def test_file_changed_after_judged_complete_is_not_committed(
    tmp_path: Path, backend: Recording, rigs: list[Rig]
) -> None:
    p = tmp_path / "ckpt_1.pt"
    p.write_bytes(b"old")
    item = ready(tmp_path, "ckpt_1.pt")
    p.write_bytes(b"newer bytes")
    rig = new_rig(rigs, backend)
    with pytest.raises(FileChanged):
        rig.commit(item)
    assert list(backend.inner.list(".ckpt-sidecar/")) == []


# -- create-only conflicts (another writer, unknown to our catalog) --------------------------
def test_conflict_with_identical_content_is_already_committed(
    tmp_path: Path, backend: Recording, rigs: list[Rig]
) -> None:
    (tmp_path / "ckpt_3.pt").write_bytes(b"same")
    other = new_rig(rigs, backend)
    other.commit(ready(tmp_path, "ckpt_3.pt"))
    me = new_rig(rigs, backend, catalog=Catalog())  # type: ignore[arg-type]
    assert me.commit(ready(tmp_path, "ckpt_3.pt")) is Outcome.ALREADY
    assert me.metric("ckpt_sidecar_manifest_conflicts_total") == 0
    assert [i.key for i in backend.inner.list(".ckpt-sidecar/manifests/")] == [
        manifest_key("ckpt_3.pt", 0)
    ]


def test_conflict_with_different_content_goes_to_the_next_generation(
    tmp_path: Path, backend: Recording, rigs: list[Rig]
) -> None:
    p = tmp_path / "last.ckpt"
    p.write_bytes(b"theirs")
    other = new_rig(rigs, backend)
    other.commit(ready(tmp_path, "last.ckpt"))
    p.write_bytes(b"mine, longer")
    me = new_rig(rigs, backend, catalog=Catalog())  # type: ignore[arg-type]
    with capture_logs() as logs:
        assert me.commit(ready(tmp_path, "last.ckpt")) is Outcome.COMMITTED
    assert me.metric("ckpt_sidecar_manifest_conflicts_total") == 1
    assert any(e["event"] == "checkpoint.manifest_conflict" for e in logs)
    g1 = manifest_at(backend, manifest_key("last.ckpt", 1))
    assert [f.key for f in g1.files] == ["last.ckpt@g1"]
    assert obj(backend, "last.ckpt@g1", tmp_path) == b"mine, longer"
    g0 = manifest_at(backend, manifest_key("last.ckpt", 0))
    assert g0.files[0].size == len(b"theirs"), "their manifest is left as it was"


def test_conflict_never_overwrites_objects_of_the_existing_manifest(
    tmp_path: Path, backend: Recording, rigs: list[Rig]
) -> None:
    p = tmp_path / "last.ckpt"
    p.write_bytes(b"theirs")
    other = new_rig(rigs, backend)
    other.commit(ready(tmp_path, "last.ckpt"))
    p.write_bytes(b"mine, longer")
    me = new_rig(rigs, backend, catalog=Catalog())  # type: ignore[arg-type]
    me.commit(ready(tmp_path, "last.ckpt"))
    g0 = manifest_at(backend, manifest_key("last.ckpt", 0))
    try:
        verify_manifest(backend, g0, deep=True, tmp_dir=tmp_path)
    except VerifyFailed as e:
        pytest.fail(f"a committed checkpoint was damaged: {e}")


def _outrank_rig(tmp_path: Path, backend: Recording, rigs: list[Rig]) -> tuple[Rig, list[str]]:
    """keep_last 2 with steps 500 and 400 committed; the names reported durable."""
    for n in ("ckpt_500.pt", "ckpt_400.pt"):
        (tmp_path / n).write_bytes(n.encode())
    rig = new_rig(rigs, backend, keep_last=2)
    durable: list[str] = []
    rig.committer.on_committed = lambda item: durable.append(item.name)
    for n in ("ckpt_500.pt", "ckpt_400.pt"):
        assert rig.commit(ready(tmp_path, n)) is Outcome.COMMITTED
    durable.clear()
    return rig, durable


@pytest.mark.parametrize("name", ["ckpt_20.pt", "emergency.pt"])
def test_an_outranked_checkpoint_of_a_new_run_in_an_old_destination_is_not_reported_durable(
    tmp_path: Path, backend: Recording, rigs: list[Rig], name: str
) -> None:
    rig, durable = _outrank_rig(tmp_path, backend, rigs)
    for old in ("ckpt_500.pt", "ckpt_400.pt"):  # the earlier run's, on another machine
        (tmp_path / old).unlink()
    (tmp_path / name).write_bytes(b"written by this run, after the commits")
    with capture_logs() as logs:
        assert rig.commit(ready(tmp_path, name)) is Outcome.OUTRANKED
    assert durable == [], "reported durable though nothing was uploaded"
    warn = [e for e in logs if e["event"] == "checkpoint.outranked"]
    assert warn and warn[0]["log_level"] == "warning" and "prefix" in warn[0]["fix"]
    assert not [k for _, k in backend.ops("put_file") if name in k]


def test_an_old_local_copy_outranked_by_newer_commits_is_covered_by_them(
    tmp_path: Path, backend: Recording, rigs: list[Rig]
) -> None:
    old = tmp_path / "ckpt_20.pt"
    old.write_bytes(b"an old local checkpoint, found again after a restart")
    os.utime(old, (time.time() - 3600, time.time() - 3600))
    rig, durable = _outrank_rig(tmp_path, backend, rigs)
    with capture_logs() as logs:
        assert rig.commit(ready(tmp_path, "ckpt_20.pt")) is Outcome.OUTRANKED
    assert durable == ["ckpt_20.pt"]
    assert [e["log_level"] for e in logs if e["event"] == "checkpoint.outranked"] == ["info"]


def test_a_manifest_that_does_not_parse_is_never_written_over(
    tmp_path: Path, backend: Recording, rigs: list[Rig]
) -> None:
    """Damaged or of a newer format, it may name objects under its generation's keys."""
    (tmp_path / "step_1").mkdir()
    (tmp_path / "step_1" / "w.pt").write_bytes(b"mine")
    theirs = tmp_path / "theirs.pt"
    theirs.write_bytes(b"named by the unreadable manifest")
    backend.put_file("step_1/w.pt", theirs)
    backend.put_bytes(manifest_key("step_1", 0), b'{"format": 99}')
    rig = new_rig(rigs, backend)
    with capture_logs() as logs:
        assert rig.commit(ready(tmp_path, "step_1")) is Outcome.COMMITTED
    assert obj(backend, "step_1/w.pt", tmp_path) == b"named by the unreadable manifest"
    m = manifest_at(backend, manifest_key("step_1", 1))
    assert [f.key for f in m.files] == ["step_1@g1/w.pt"]
    assert any(e["event"] == "checkpoint.manifest_conflict" for e in logs)


def test_a_checkpoint_without_a_step_beside_committed_stepped_ones_is_covered(
    tmp_path: Path, backend: Recording, rigs: list[Rig]
) -> None:
    """Lightning's ``last.ckpt``, saved again after ``epoch=..-step=N.ckpt`` is committed:
    the newest complete checkpoint here is durable, so a drain must say so."""
    rig, durable = _outrank_rig(tmp_path, backend, rigs)
    with capture_logs() as logs:
        for epoch in range(2):
            (tmp_path / "last.ckpt").write_bytes(b"the same weights again %d" % epoch)
            assert rig.commit(ready(tmp_path, "last.ckpt")) is Outcome.OUTRANKED
    assert durable == ["last.ckpt", "last.ckpt"]
    told = [e for e in logs if e["event"] == "checkpoint.outranked"]
    assert [e["log_level"] for e in told] == ["warning", "info"], "warned once, not every save"
    assert "step" in told[0]["fix"]


@pytest.mark.parametrize("name", ["ckpt_20.pt", "last.ckpt"])
def test_old_files_of_an_earlier_run_in_the_folder_do_not_cover_a_new_runs_checkpoint(
    tmp_path: Path, backend: Recording, rigs: list[Rig], name: str
) -> None:
    rig, durable = _outrank_rig(tmp_path, backend, rigs)
    for old in ("ckpt_500.pt", "ckpt_400.pt"):  # still here, from the earlier run
        os.utime(tmp_path / old, (time.time() - 3600, time.time() - 3600))
    (tmp_path / name).write_bytes(b"the new run")
    with capture_logs() as logs:
        assert rig.commit(ready(tmp_path, name)) is Outcome.OUTRANKED
    assert durable == []
    assert [e["log_level"] for e in logs if e["event"] == "checkpoint.outranked"] == ["warning"]
