"""verify and restore check a checkpoint's objects with one listing where it can stand in
for a HEAD per object (on real servers: S3 on SeaweedFS, GCS on fake-gcs-server), and
still name the object that is missing, cut or changed."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from sidecar.checks import VerifyFailed, verify_manifest
from sidecar.manifest import Manifest, manifest_key
from sidecar.restore import restore
from sidecar.storage.base import Backend
from tests.conformance.test_s3 import s3_backend
from tests.servers.gcs import GcsServer, gcs_backend
from tests.servers.seaweedfs import S3Server, new_bucket
from tests.unit.test_commit import Recording, Rig, manifest_at, ready

FILES = 6


@pytest.fixture(params=["s3", "gcs"])
def backend(request: pytest.FixtureRequest) -> Iterator[Recording]:
    inner: Backend
    if request.param == "s3":
        server: S3Server = request.getfixturevalue("s3_env")
        inner = s3_backend(server, new_bucket(server, "checks"))
    else:
        gcs: GcsServer = request.getfixturevalue("fake_gcs_server")
        inner = gcs_backend(gcs.url, gcs.new_bucket("checks"))
    yield Recording(inner)
    inner.close()


@pytest.fixture
def committed(tmp_path: Path, backend: Recording) -> Iterator[tuple[Manifest, Manifest]]:
    """step_1 and step_2, each a folder of FILES small files, committed as the daemon does."""
    rig = Rig(backend)
    try:
        for step in (1, 2):
            folder = tmp_path / "src" / f"step_{step}"
            folder.mkdir(parents=True)
            for i in range(FILES):
                (folder / f"shard_{i}.bin").write_bytes(os.urandom(1000 + i))
            rig.commit(ready(tmp_path / "src", f"step_{step}"))
    finally:
        rig.close()
    backend.clear()
    yield tuple(manifest_at(backend, manifest_key(f"step_{s}", 0)) for s in (1, 2))  # type: ignore[misc]


def test_verify_asks_once_per_object_or_lists_once(
    tmp_path: Path, backend: Recording, committed: tuple[Manifest, Manifest]
) -> None:
    _, step_2 = committed
    verify_manifest(backend, step_2, deep=False, tmp_dir=tmp_path)
    heads = backend.ops("head")
    if backend.lists_crc32c:  # GCS: the listing carries each object's CRC32C
        assert backend.ops("list") == [("list", "step_2/")] and heads == []
    else:  # S3: listings carry none, so one HEAD per object, not two
        assert backend.ops("list") == []
        assert sorted(k for _, k in heads) == sorted(f.key for f in step_2.files)
    assert backend.ops("get_file") == []  # every object has a CRC32C the store verified


@pytest.mark.parametrize("damage", ["missing", "cut", "changed"])
def test_verify_names_the_object_that_differs(
    tmp_path: Path, backend: Recording, committed: tuple[Manifest, Manifest], damage: str
) -> None:
    _, step_2 = committed
    key = step_2.files[3].key
    if damage == "missing":
        backend.delete(key)
    else:
        data = backend.get_bytes(key)
        backend.put_bytes(key, data[:-1] if damage == "cut" else bytes(b ^ 1 for b in data))
    with pytest.raises(VerifyFailed, match=key) as e:
        verify_manifest(backend, step_2, deep=False, tmp_dir=tmp_path)
    want = {"missing": "missing", "cut": "size", "changed": "CRC32C"}[damage]
    assert want in str(e.value)


def test_restore_lists_the_checkpoint_instead_of_asking_for_each_object(
    tmp_path: Path, backend: Recording, committed: tuple[Manifest, Manifest]
) -> None:
    res = restore(backend, tmp_path / "restored")
    assert res.manifest.name == "step_2"
    assert backend.ops("head") == []
    assert ("list", "step_2/") in backend.ops("list")
    assert len(backend.ops("get_file")) == FILES


def test_restore_passes_over_a_checkpoint_with_a_missing_object_before_downloading_it(
    tmp_path: Path, backend: Recording, committed: tuple[Manifest, Manifest]
) -> None:
    step_1, step_2 = committed
    backend.delete(step_2.files[0].key)
    backend.clear()
    res = restore(backend, tmp_path / "restored")
    assert res.manifest.name == "step_1"
    assert step_2.files[0].key in res.skipped[0][1] and "missing" in res.skipped[0][1]
    assert sorted(k for _, k in backend.ops("get_file")) == sorted(f.key for f in step_1.files)


def test_a_single_file_checkpoint_is_asked_for_not_listed(
    tmp_path: Path, backend: Recording
) -> None:
    """Its name is the prefix of every key that starts with it (``step_1`` of ``step_10/``),
    so one HEAD is cheaper than a listing."""
    src = tmp_path / "single"
    src.mkdir()
    (src / "step_1").write_bytes(os.urandom(2000))
    (src / "step_10").mkdir()
    (src / "step_10" / "shard.bin").write_bytes(os.urandom(10))
    rig = Rig(backend)
    try:
        rig.commit(ready(src, "step_10"))
        rig.commit(ready(src, "step_1"))
    finally:
        rig.close()
    m = manifest_at(backend, manifest_key("step_1", 0))
    backend.clear()
    verify_manifest(backend, m, deep=False, tmp_dir=tmp_path)
    restore(backend, tmp_path / "restored", name="step_1")
    assert not any(prefix.startswith("step_1") for _, prefix in backend.ops("list"))
    assert [k for _, k in backend.ops("head")] == ["step_1", "step_1"]
