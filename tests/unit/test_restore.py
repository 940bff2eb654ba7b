"""Restore: newest that verifies, fallback naming the object, unsafe keys, --force, pointers."""

from __future__ import annotations

import json
import os
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from structlog.testing import capture_logs

from sidecar.manifest import manifest_key
from sidecar.restore import (
    WORK_PREFIX,
    NoneVerifies,
    NothingToRestore,
    TargetExists,
    restore,
)
from sidecar.state import StateCache
from sidecar.storage.base import Backend
from sidecar.storage.checksum import crc32c_of_bytes
from sidecar.storage.local import LocalBackend
from sidecar.storage.memory import MemoryBackend
from sidecar.watch.scan import state_of
from tests.unit.test_commit import Rig, ready


@pytest.fixture(params=["memory", "file"])
def backend(request: pytest.FixtureRequest, tmp_path: Path) -> Backend:
    if request.param == "memory":
        return MemoryBackend(f"restore-{uuid.uuid4().hex}")
    return LocalBackend(tmp_path / "remote")


@pytest.fixture
def rig(backend: Backend) -> Iterator[Rig]:
    r = Rig(backend)
    yield r
    r.close()


def tree(root: Path) -> dict[str, bytes]:
    return {
        p.relative_to(root).as_posix(): p.read_bytes()
        for p in sorted(root.rglob("*"))
        if p.is_file()
    }


def write_dir(root: Path, name: str, files: dict[str, bytes]) -> None:
    for rel, data in files.items():
        p = root / name / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(data)


STEP1 = {"model.pt": b"m1" * 1000, "sub/opt.pt": b"o1"}
STEP2 = {"model.pt": b"m2" * 1000, "sub/opt.pt": b"o2", "extra.bin": b""}


@pytest.fixture
def two_commits(tmp_path: Path, rig: Rig) -> Path:
    src = tmp_path / "src"
    write_dir(src, "step_1", STEP1)
    write_dir(src, "step_2", STEP2)
    rig.commit(ready(src, "step_1"))
    rig.commit(ready(src, "step_2"))
    return src


def corrupt(backend: Backend, key: str) -> None:
    """Same size, different bytes: only a checksum notices."""
    data = backend.get_bytes(key)
    backend.put_bytes(key, bytes(b ^ 0xFF for b in data))


def no_work_dirs(target: Path) -> bool:
    return not any(p.name.startswith(WORK_PREFIX) for p in target.iterdir())


def test_restores_the_newest_byte_for_byte(
    tmp_path: Path, backend: Backend, two_commits: Path
) -> None:
    target = tmp_path / "restored"
    res = restore(backend, target)
    assert res.manifest.name == "step_2" and res.skipped == ()
    assert res.path == target / "step_2"
    assert tree(target / "step_2") == STEP2
    assert sorted(p.name for p in target.iterdir()) == ["step_2"]


def test_restores_a_named_checkpoint_and_single_files(tmp_path: Path, rig: Rig) -> None:
    src = tmp_path / "src"
    src.mkdir()
    (src / "last.ckpt").write_bytes(b"gen0")
    rig.commit(ready(src, "last.ckpt"))
    (src / "last.ckpt").write_bytes(b"generation one")
    rig.commit(ready(src, "last.ckpt"))
    write_dir(src, "step_9", {"a": b"a"})
    rig.commit(ready(src, "step_9"))
    target = tmp_path / "t"
    res = restore(rig.backend, target, name="last.ckpt")
    assert res.manifest.generation == 1
    assert (target / "last.ckpt").read_bytes() == b"generation one", "restored under plain name"
    assert not (target / "last.ckpt@g1").exists()


def test_corrupted_object_falls_back_naming_the_object(
    tmp_path: Path, backend: Backend, two_commits: Path
) -> None:
    corrupt(backend, "step_2/sub/opt.pt")
    target = tmp_path / "t"
    with capture_logs() as logs:
        res = restore(backend, target)
    assert res.manifest.name == "step_1"
    assert tree(target / "step_1") == STEP1
    assert not (target / "step_2").exists()
    [(name, reason)] = res.skipped
    assert name == "step_2" and "step_2/sub/opt.pt" in reason
    fallback = [e for e in logs if e["event"] == "restore.fallback"]
    assert fallback and "step_2/sub/opt.pt" in fallback[0]["reason"]
    assert no_work_dirs(target)


def test_missing_object_falls_back_naming_the_object(
    tmp_path: Path, backend: Backend, two_commits: Path
) -> None:
    backend.delete("step_2/model.pt")
    target = tmp_path / "t"
    res = restore(backend, target)
    assert res.manifest.name == "step_1"
    assert "step_2/model.pt" in res.skipped[0][1] and "missing" in res.skipped[0][1]
    assert tree(target / "step_1") == STEP1


def test_truncated_object_falls_back(tmp_path: Path, backend: Backend, two_commits: Path) -> None:
    backend.put_bytes("step_2/model.pt", b"m2")
    res = restore(backend, tmp_path / "t")
    assert res.manifest.name == "step_1"
    assert "step_2/model.pt" in res.skipped[0][1]


def test_none_verifies_lists_every_reason(
    tmp_path: Path, backend: Backend, two_commits: Path
) -> None:
    corrupt(backend, "step_2/model.pt")
    backend.delete("step_1/sub/opt.pt")
    target = tmp_path / "t"
    with pytest.raises(NoneVerifies) as e:
        restore(backend, target)
    assert "step_2/model.pt" in str(e.value) and "step_1/sub/opt.pt" in str(e.value)
    assert list(target.iterdir()) == [], "nothing half-restored is left behind"


def test_empty_destination_is_nothing_to_restore(tmp_path: Path, backend: Backend) -> None:
    with pytest.raises(NothingToRestore):
        restore(backend, tmp_path / "t")


def test_existing_entry_is_refused_without_force(
    tmp_path: Path, backend: Backend, two_commits: Path
) -> None:
    target = tmp_path / "t"
    write_dir(target, "step_2", {"mine.pt": b"precious"})
    with pytest.raises(TargetExists, match="--force"):
        restore(backend, target)
    assert tree(target) == {"step_2/mine.pt": b"precious"}


def test_force_moves_the_existing_entry_aside(
    tmp_path: Path, backend: Backend, two_commits: Path
) -> None:
    target = tmp_path / "t"
    write_dir(target, "step_2", {"mine.pt": b"precious"})
    restore(backend, target, force=True)
    assert tree(target / "step_2") == STEP2
    [aside] = [p for p in target.iterdir() if p.name.startswith("step_2.replaced-")]
    assert tree(aside) == {"mine.pt": b"precious"}


def test_force_never_overwrites_an_earlier_moved_aside_copy(tmp_path: Path, rig: Rig) -> None:
    src = tmp_path / "src"
    src.mkdir()
    (src / "model_5.pt").write_bytes(b"committed")
    rig.commit(ready(src, "model_5.pt"))
    target = tmp_path / "t"
    target.mkdir()
    (target / "model_5.pt").write_bytes(b"mine")
    now = time.time()
    for dt in range(3):  # whatever second the restore runs in, an earlier aside copy exists
        stamp = time.strftime("%Y%m%dT%H%M%S", time.localtime(now + dt))
        (target / f"model_5.pt.replaced-{stamp}").write_bytes(f"earlier {dt}".encode())
    before = tree(target)
    restore(rig.backend, target, force=True)
    after = tree(target)
    assert after["model_5.pt"] == b"committed"
    lost = {k: v for k, v in before.items() if v not in after.values()}
    assert lost == {}, f"data lost by --force: {lost}"


def _write_manifest(backend: Backend, name: str, files: list[dict[str, object]], seq: int) -> None:
    m = {
        "format": 1,
        "name": name,
        "generation": 0,
        "layout": "plain",
        "is_dir": True,
        "step": 999,
        "sequence": seq,
        "files": files,
    }
    backend.put_bytes(manifest_key(name, 0), json.dumps(m).encode())


@pytest.mark.parametrize(
    "bad_path", ["../../escape.txt", "../escape.txt", "/tmp/escape-abs.txt", "a/../../escape.txt"]
)
def test_manifest_escaping_the_target_is_refused_and_older_one_restored(
    tmp_path: Path, backend: Backend, two_commits: Path, bad_path: str
) -> None:
    backend.put_bytes("step_999/x", b"evil")
    _write_manifest(
        backend,
        "step_999",
        [{"path": bad_path, "key": "step_999/x", "size": 4, "crc32c": crc32c_of_bytes(b"evil")}],
        seq=100,
    )
    target = tmp_path / "deep" / "t"
    with capture_logs() as logs:
        res = restore(backend, target)
    assert res.manifest.name == "step_2", "the unsafe manifest is never trusted"
    assert [e for e in logs if e["event"] == "restore.manifest_invalid"]
    assert not any(p.name.startswith("escape") for p in tmp_path.rglob("*"))
    assert not Path("/tmp/escape-abs.txt").exists()


def test_only_an_invalid_manifest_is_none_verifies_not_nothing(
    tmp_path: Path, backend: Backend
) -> None:
    backend.put_bytes(manifest_key("step_5", 0), b"{ not json")
    with pytest.raises(NoneVerifies, match="step_5"):
        restore(backend, tmp_path / "t")


def test_unparseable_number_in_one_manifest_does_not_stop_restore(
    tmp_path: Path, backend: Backend, two_commits: Path
) -> None:
    backend.put_bytes(manifest_key("step_7", 0), b'{"format": 1, "step": ' + b"9" * 5000 + b"}")
    res = restore(backend, tmp_path / "t")
    assert res.manifest.name == "step_2"


def test_file_and_folder_with_the_same_path_falls_back(
    tmp_path: Path, backend: Backend, two_commits: Path
) -> None:
    crc = crc32c_of_bytes(b"z")
    backend.put_bytes("step_9/a", b"z")
    backend.put_bytes("step_9/a_b", b"z")
    _write_manifest(
        backend,
        "step_9",
        [
            {"path": "a", "key": "step_9/a", "size": 1, "crc32c": crc},
            {"path": "a/b", "key": "step_9/a_b", "size": 1, "crc32c": crc},
        ],
        seq=100,
    )
    res = restore(backend, tmp_path / "t")
    assert res.manifest.name == "step_2"


def test_deepspeed_latest_pointer_is_written(tmp_path: Path, rig: Rig) -> None:
    src = tmp_path / "src"
    write_dir(src, "global_step10", {"mp_rank_00_model_states.pt": b"ds10"})
    write_dir(src, "global_step20", {"mp_rank_00_model_states.pt": b"ds20"})
    rig.commit(ready(src, "global_step10", layout="deepspeed"))
    rig.commit(ready(src, "global_step20", layout="deepspeed"))
    corrupt(rig.backend, "global_step20/mp_rank_00_model_states.pt")
    target = tmp_path / "t"
    target.mkdir()
    (target / "latest").write_text("global_step20\n")  # left by the trainer before preemption
    res = restore(rig.backend, target)
    assert res.manifest.name == "global_step10"
    assert (target / "latest").read_text().strip() == "global_step10"
    assert (target / "global_step10" / "mp_rank_00_model_states.pt").read_bytes() == b"ds10"


def test_state_cache_records_restored_files(
    tmp_path: Path, backend: Backend, two_commits: Path
) -> None:
    cache = StateCache(tmp_path / "state")
    target = tmp_path / "t"
    restore(backend, target, cache=cache)
    p = target / "step_2" / "model.pt"
    again = StateCache(tmp_path / "state")
    assert again.get(p, state_of(os.lstat(p))) == crc32c_of_bytes(STEP2["model.pt"])


def test_progress_reports_every_byte(tmp_path: Path, backend: Backend, two_commits: Path) -> None:
    seen: list[int] = []
    restore(backend, tmp_path / "t", progress=seen.append)
    assert sum(seen) == sum(len(v) for v in STEP2.values())


def test_every_restored_file_and_folder_is_on_disk_before_it_is_named(
    tmp_path: Path, backend: Backend, two_commits: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A crash after restore must not leave a file under its name whose bytes never reached
    the disk (the state cache would take it as verified)."""
    target = tmp_path / "restored"
    target.mkdir()
    synced: list[tuple[str, bool]] = []  # (what, was it already under its final name)
    fsync = os.fsync

    def recording(fd: int) -> None:
        where = os.readlink(f"/proc/self/fd/{fd}")
        synced.append((where, (target / "step_2").exists()))
        fsync(fd)

    monkeypatch.setattr(os, "fsync", recording)
    restore(backend, target)
    named = [w for w, placed in synced if placed]
    before = {Path(w).name for w, placed in synced if not placed}
    assert {"model.pt", "opt.pt", "extra.bin", "sub", "step_2"} <= before
    assert str(target) in named, "the rename into place was not made durable"
