"""Retention: keep_last newest plus every keep_every_steps; manifest first, then objects."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from structlog.testing import capture_logs

from sidecar.catalog import Catalog
from sidecar.manifest import Manifest, ManifestFile, manifest_key
from sidecar.retention import Retention
from sidecar.storage.base import PermanentError
from sidecar.storage.checksum import crc32c_of_bytes
from sidecar.storage.memory import MemoryBackend
from tests.unit.test_commit import Recording, Rig, ready

CRC = crc32c_of_bytes(b"x")


def man(name: str, step: int | None, seq: int, keys: tuple[str, ...] = ()) -> Manifest:
    files = tuple(ManifestFile(k.split("/", 1)[-1], k, 1, CRC) for k in (keys or (f"{name}/w",)))
    return Manifest(name, 0, "plain", True, step, seq, "", "", "h", "v", files)


@pytest.fixture
def backend() -> Recording:
    return Recording(MemoryBackend(f"ret-{uuid.uuid4().hex}"))


@pytest.fixture
def rig(backend: Recording) -> Iterator[Rig]:
    r = Rig(backend, keep_last=2)
    yield r
    r.close()


def test_keep_last_below_two_is_refused(backend: Recording) -> None:
    with pytest.raises(ValueError, match="keep_last must be >= 2"):
        Retention(backend, 1)


def test_keep_last_and_keep_every_steps(backend: Recording) -> None:
    ms = sorted(
        (man(f"step_{s}", s, s) for s in range(100, 1100, 100)),
        key=Manifest.order,
        reverse=True,
    )
    doomed = Retention(backend, 3, keep_every_steps=500).doomed(ms)
    assert sorted(m.step for m in doomed if m.step is not None) == [100, 200, 300, 400, 600, 700]


@given(
    st.lists(
        st.tuples(st.one_of(st.none(), st.integers(0, 30)), st.integers(0, 1000)),
        unique_by=lambda t: t[1],
        max_size=25,
    ),
    st.integers(2, 6),
    st.integers(0, 7),
)
@settings(max_examples=200, deadline=None, database=None)
def test_newest_keep_last_are_never_doomed(
    specs: list[tuple[int | None, int]], keep_last: int, keep_every: int
) -> None:
    ms = sorted(
        (man(f"c{seq}", step, seq) for step, seq in specs), key=Manifest.order, reverse=True
    )
    doomed = Retention(MemoryBackend("unused"), keep_last, keep_every).doomed(ms)
    assert not set(ms[:keep_last]) & set(doomed), "one of the newest keep_last was doomed"
    assert len(ms) - len(doomed) >= min(len(ms), keep_last)
    for m in doomed:
        assert not (keep_every and m.step is not None and m.step % keep_every == 0)


def test_after_commits_only_the_newest_two_remain_manifest_deleted_first(
    tmp_path: Path, rig: Rig, backend: Recording
) -> None:
    for s in (1, 2, 3, 4):
        d = tmp_path / f"step_{s}"
        d.mkdir()
        (d / "a.pt").write_bytes(f"a{s}".encode())
        (d / "b.pt").write_bytes(f"b{s}".encode())
        rig.commit(ready(tmp_path, f"step_{s}"))
    keys = sorted(i.key for i in backend.inner.list())
    assert keys == sorted(
        [
            ".ckpt-sidecar/LATEST",
            manifest_key("step_3", 0),
            manifest_key("step_4", 0),
            "step_3/a.pt",
            "step_3/b.pt",
            "step_4/a.pt",
            "step_4/b.pt",
        ]
    )
    deletes = [k for _, k in backend.ops("delete")]
    for s in (1, 2):
        mi = deletes.index(manifest_key(f"step_{s}", 0))
        assert mi < deletes.index(f"step_{s}/a.pt"), "the manifest is the tombstone: first"
        assert mi < deletes.index(f"step_{s}/b.pt")
    assert [m.name for m in rig.catalog.all()] == ["step_4", "step_3"]


def test_objects_named_by_a_live_manifest_are_kept(backend: Recording) -> None:
    for k in ("shared/w", "old/only"):
        backend.inner.put_bytes(k, b"x")
    old = man("old", 1, 1, ("shared/w", "old/only"))
    mid = man("mid", 2, 2, ("shared/w",))
    new = man("new", 3, 3)
    cat = Catalog()
    for m in (old, mid, new):
        backend.inner.put_bytes(m.key, m.to_json())
        cat.add(m)
    deleted = Retention(backend, 2).apply(cat)
    assert deleted == [old]
    left = {i.key for i in backend.inner.list()}
    assert "shared/w" in left, "still named by a live manifest"
    assert "old/only" not in left
    assert old.key not in left


def _three_committed(backend: Recording) -> Catalog:
    """Steps 1, 2, 3 (``s1``..``s3``) committed in ``backend``, and a catalog of them."""
    cat = Catalog()
    for s in (1, 2, 3):
        m = man(f"s{s}", s, s)
        backend.inner.put_bytes(m.key, m.to_json())
        backend.inner.put_bytes(m.files[0].key, b"x")
        cat.add(m)
    return cat


def test_failed_manifest_delete_keeps_everything_and_is_logged(backend: Recording) -> None:
    class NoDelete(Recording):
        def delete(self, key: str) -> None:
            raise PermanentError("access denied: s3:DeleteObject")

    nd = NoDelete(backend.inner)
    cat = _three_committed(backend)
    with capture_logs() as logs:
        assert Retention(nd, 2).apply(cat) == []
    assert [m.name for m in cat.all()] == ["s3", "s2", "s1"], "retried at the next commit"
    assert "s1/w" in {i.key for i in backend.inner.list()}
    assert any(e["event"] == "retention.delete_failed" for e in logs)


def test_checkpoints_without_step_are_ordered_by_sequence(backend: Recording) -> None:
    cat = Catalog()
    for seq in (5, 6, 7):
        m = man(f"last{seq}", None, seq)
        backend.inner.put_bytes(m.key, m.to_json())
        cat.add(m)
    deleted = Retention(backend, 2).apply(cat)
    assert [m.name for m in deleted] == ["last5"]


@pytest.mark.parametrize(
    ("keep_every", "step", "outranked"),
    [
        (0, 9, False),  # newer than all: kept
        (0, 5, False),  # only one committed step above it (7): within keep_last = 2
        (0, 4, True),  # two above it (5, 7): retention would delete it at once
        (0, None, True),  # no step sorts before any step
        (4, 4, False),  # ... unless keep_every_steps keeps it
        (3, 4, True),
    ],
)
def test_outranked_means_retention_would_delete_it_at_once(
    keep_every: int, step: int | None, outranked: bool
) -> None:
    committed = [man("step_7", 7, 3), man("step_5", 5, 2), man("step_4", 4, 1)]
    r = Retention(MemoryBackend(f"o-{uuid.uuid4().hex}"), keep_last=2, keep_every_steps=keep_every)
    assert r.outranked(step, committed) is outranked


def test_a_manifest_committed_again_since_it_was_read_is_not_deleted(backend: Recording) -> None:
    """Another daemon on this prefix (a restart while the old one still runs) deleted
    ``a`` and committed that name again at generation 0: this daemon's catalog still holds
    the old ``a``, and deleting by key would delete the other's new checkpoint."""
    cat = _three_committed(backend)
    again = man("s1", 1, 4)  # same name and generation, a new commit
    backend.inner.put_bytes(again.key, again.to_json())
    with capture_logs() as logs:
        assert Retention(backend, 2).apply(cat) == []
    left = {i.key for i in backend.inner.list()}
    assert again.key in left and "s1/w" in left
    assert any(e["event"] == "retention.changed" for e in logs)
    assert again in cat.all(), "the catalog takes what the store holds"


def test_a_manifest_deleted_already_still_has_its_objects_deleted(backend: Recording) -> None:
    """The manifest's delete went through but its reply was lost: at the next commit its
    objects go too (they were left for the sweep, which may be off)."""
    cat = _three_committed(backend)
    backend.inner.delete(man("s1", 1, 1).key)
    assert Retention(backend, 2).apply(cat) == [man("s1", 1, 1)]
    left = {i.key for i in backend.inner.list()}
    assert "s1/w" not in left and "s2/w" in left
