"""The orphan sweep deletes only old objects of checkpoint names that no manifest names."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from sidecar.manifest import Manifest, ManifestFile
from sidecar.orphans import owner_name, sweep_orphans
from sidecar.storage.checksum import crc32c_of_bytes
from sidecar.storage.local import LocalBackend
from sidecar.watch.layouts import layout_for

DAY = 86400.0
PLAIN = layout_for("plain")


def put(backend: LocalBackend, key: str, age: float, data: bytes = b"w") -> None:
    backend.put_bytes(key, data)
    t = time.time() - age
    os.utime(backend.root / key, (t, t))


def commit(backend: LocalBackend, name: str, keys: list[str]) -> None:
    files = tuple(ManifestFile(k.split("/", 1)[-1], k, 1, crc32c_of_bytes(b"w")) for k in keys)
    m = Manifest(name, 0, "plain", True, 1, 1, "", "", "h", "v", files)
    backend.put_bytes(m.key, m.to_json())


def keys(backend: LocalBackend) -> set[str]:
    return {i.key for i in backend.list("")}


@pytest.mark.parametrize(
    ("key", "owner"),
    [
        ("step_3/w.bin", ("step_3", True)),
        ("step_3@g2/w.bin", ("step_3", True)),
        ("last.ckpt@g1", ("last.ckpt", False)),
        ("model.pt", ("model.pt", False)),
        (".ckpt-sidecar/manifests/step_3.json", None),
        (".ckpt-sidecar-tmp-123", None),
    ],
)
def test_owner_name(key: str, owner: tuple[str, bool] | None) -> None:
    assert owner_name(key) == owner


def test_deletes_only_old_unnamed_objects_of_checkpoint_names(tmp_path: Path) -> None:
    b = LocalBackend(tmp_path)
    put(b, "step_1/w.bin", 3 * DAY)  # live: step_1's manifest names it
    commit(b, "step_1", ["step_1/w.bin"])
    put(b, "step_2/w.bin", 2 * DAY)  # retention deleted the manifest, then was killed
    put(b, "step_2@g1/x.bin", 2 * DAY)
    put(b, "model_9.pt", 2 * DAY)  # a single-file checkpoint whose manifest never came
    put(b, "step_4/w.bin", 3600)  # an upload of the last hour: maybe still running
    put(b, "notes.txt", 9 * DAY)  # not a checkpoint name: someone else's
    put(b, "data/shard.bin", 9 * DAY)
    result = sweep_orphans(b, PLAIN, older_than=DAY)
    assert result.skipped_reason is None
    assert sorted(result.deleted) == ["model_9.pt", "step_2/w.bin", "step_2@g1/x.bin"]
    assert keys(b) == {
        "step_1/w.bin",
        ".ckpt-sidecar/manifests/step_1.json",
        "step_4/w.bin",
        "notes.txt",
        "data/shard.bin",
    }


def test_an_unreadable_manifest_stops_the_sweep(tmp_path: Path) -> None:
    b = LocalBackend(tmp_path)
    put(b, "step_2/w.bin", 2 * DAY)
    b.put_bytes(".ckpt-sidecar/manifests/step_2.json", b"{not json")
    result = sweep_orphans(b, PLAIN, older_than=DAY)
    assert result.deleted == ()
    assert result.skipped_reason is not None and "step_2.json" in result.skipped_reason
    assert "step_2/w.bin" in keys(b)


def test_new_work_interrupts_the_sweep(tmp_path: Path) -> None:
    b = LocalBackend(tmp_path)
    for i in range(5):
        put(b, f"step_{i}/w.bin", 2 * DAY)
    calls = iter([False, False, True])
    result = sweep_orphans(b, PLAIN, older_than=DAY, abort=lambda: next(calls, True))
    assert len(result.deleted) == 2
    assert result.skipped_reason == "interrupted by new work"
    assert len([k for k in keys(b) if k.startswith("step_")]) == 3
