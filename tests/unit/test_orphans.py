"""The orphan sweep deletes only old objects of checkpoint names that no manifest names."""

from __future__ import annotations

import errno
import json
import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from sidecar.manifest import LATEST_KEY, Manifest, ManifestFile
from sidecar.metrics import Metrics
from sidecar.orphans import (
    RETRY_INCOMPLETE_SECONDS,
    SWEEP_EVERY_SECONDS,
    OrphanSweeper,
    owner_name,
    sweep_orphans,
)
from sidecar.storage.base import ObjectInfo, PermanentError
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


def test_an_unreadable_manifest_keeps_its_names_objects_and_the_rest_is_swept(
    tmp_path: Path,
) -> None:
    """One manifest that does not parse (a newer format after a downgrade, damage) must not
    turn the sweep off for good: only its own checkpoint name's objects are kept."""
    b = LocalBackend(tmp_path)
    put(b, "step_2/w.bin", 2 * DAY)
    put(b, "step_2@g1/w.bin", 2 * DAY)
    b.put_bytes(".ckpt-sidecar/manifests/step_2@g1.json", b"{not json")
    put(b, "step_3/w.bin", 2 * DAY)  # an orphan of another name
    result = sweep_orphans(b, PLAIN, older_than=DAY)
    assert result.deleted == ("step_3/w.bin",) and result.skipped_reason is None
    assert {"step_2/w.bin", "step_2@g1/w.bin"} <= keys(b)


def _unlistable(monkeypatch: pytest.MonkeyPatch, folder: str, error: OSError) -> None:
    """Listing a folder named ``folder`` raises ``error`` (as root, where a mode cannot deny
    a read, and for an I/O error, the failure is simulated)."""
    real = os.scandir

    def scandir(path: Any = ".") -> Any:
        if str(path).endswith(folder):
            raise type(error)(error.errno, error.strerror, str(path))
        return real(path)

    monkeypatch.setattr(os, "scandir", scandir)


def test_a_listing_that_fails_or_lacks_the_newest_commit_deletes_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """file://: a folder of manifests that cannot be read (EIO, ESTALE on NFS) listed as
    empty, and the sweep deleted every committed object older than a day."""
    b = LocalBackend(tmp_path)
    for step in (100, 200):
        put(b, f"step_{step}/w.bin", 3 * DAY)
        commit(b, f"step_{step}", [f"step_{step}/w.bin"])
    b.put_bytes(
        LATEST_KEY, json.dumps({"manifest": ".ckpt-sidecar/manifests/step_200.json"}).encode()
    )
    _unlistable(monkeypatch, "manifests", OSError(errno.EIO, "Input/output error"))
    result = sweep_orphans(b, PLAIN, older_than=DAY)
    assert result.deleted == () and "listing manifests failed" in str(result.skipped_reason)
    monkeypatch.undo()
    real_list = b.list

    def lagging(prefix: str = "") -> Iterator[ObjectInfo]:  # a listing behind the store
        return (i for i in real_list(prefix) if not i.key.endswith("step_200.json"))

    monkeypatch.setattr(b, "list", lagging)
    result = sweep_orphans(b, PLAIN, older_than=DAY)
    assert result.deleted == () and "may be incomplete" in str(result.skipped_reason)
    assert {"step_100/w.bin", "step_200/w.bin"} <= keys(b)
    monkeypatch.undo()
    # LATEST out of date (its manifest deleted by hand): the sweep goes on.
    b.delete(".ckpt-sidecar/manifests/step_200.json")
    result = sweep_orphans(b, PLAIN, older_than=DAY)
    assert result.deleted == ("step_200/w.bin",) and result.skipped_reason is None


def test_a_foreign_folder_it_may_not_read_is_left_out_not_fatal(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A destination at a volume's root holds a root-owned lost+found: the sweep goes on."""
    b = LocalBackend(tmp_path)
    (tmp_path / "lost+found").mkdir()
    put(b, "step_3/w.bin", 2 * DAY)
    _unlistable(monkeypatch, "lost+found", PermissionError(errno.EACCES, "Permission denied"))
    result = sweep_orphans(b, PLAIN, older_than=DAY)
    assert result.deleted == ("step_3/w.bin",) and result.skipped_reason is None


def test_a_delete_that_fails_does_not_stop_the_sweep(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An object under a legal hold is reported; the other orphans still go."""
    b = LocalBackend(tmp_path)
    for step in (1, 2, 3):
        put(b, f"step_{step}/w.bin", 2 * DAY)
    real = b.delete

    def held(key: str) -> None:
        if key == "step_1/w.bin":
            raise PermanentError("AccessDenied: object is under a legal hold")
        real(key)

    monkeypatch.setattr(b, "delete", held)
    result = sweep_orphans(b, PLAIN, older_than=DAY)
    assert sorted(result.deleted) == ["step_2/w.bin", "step_3/w.bin"]
    assert "1 not deleted, first step_1/w.bin" in str(result.skipped_reason)


def test_new_work_interrupts_the_sweep(tmp_path: Path) -> None:
    b = LocalBackend(tmp_path)
    for i in range(5):
        put(b, f"step_{i}/w.bin", 2 * DAY)

    def after_two_deletes() -> bool:
        return len([k for k in keys(b) if k.startswith("step_")]) <= 3

    result = sweep_orphans(b, PLAIN, older_than=DAY, abort=after_two_deletes)
    assert len(result.deleted) == 2
    assert result.skipped_reason == "interrupted by new work"
    assert len([k for k in keys(b) if k.startswith("step_")]) == 3


def test_sweeper_runs_at_start_then_every_six_hours_and_retries_an_incomplete_one_sooner(
    tmp_path: Path,
) -> None:
    b = LocalBackend(tmp_path)
    now = [0.0]
    metrics = Metrics()
    sweeper = OrphanSweeper(b, PLAIN, metrics, older_than_hours=24, clock=lambda: now[0])
    put(b, "step_2/w.bin", 2 * DAY)
    assert sweeper.due_in() == 0  # the commit loop, idle, sleeps this long before maybe()
    sweeper.maybe(abort=lambda: False)  # the first idle moment after start
    assert "step_2/w.bin" not in keys(b)
    assert sweeper.due_in() == SWEEP_EVERY_SECONDS
    put(b, "step_3/w.bin", 2 * DAY)
    now[0] = SWEEP_EVERY_SECONDS - 1
    sweeper.maybe(abort=lambda: False)
    assert "step_3/w.bin" in keys(b), "not due yet"
    assert sweeper.due_in() == 1
    now[0] = SWEEP_EVERY_SECONDS
    sweeper.maybe(abort=lambda: True)  # new work arrived at once: incomplete
    assert "step_3/w.bin" in keys(b)
    assert sweeper.due_in() == RETRY_INCOMPLETE_SECONDS
    now[0] += RETRY_INCOMPLETE_SECONDS
    sweeper.maybe(abort=lambda: False)
    assert "step_3/w.bin" not in keys(b)
    assert metrics.registry.get_sample_value("ckpt_sidecar_orphans_deleted_total") == 2


def test_sweeper_is_off_at_zero_hours(tmp_path: Path) -> None:
    b = LocalBackend(tmp_path)
    put(b, "step_2/w.bin", 9 * DAY)
    off = OrphanSweeper(b, PLAIN, Metrics(), older_than_hours=0)
    assert off.due_in() is None  # the idle commit loop then waits for work only
    off.maybe(abort=lambda: False)
    assert "step_2/w.bin" in keys(b)


def test_a_destination_nested_in_this_one_is_never_swept(tmp_path: Path) -> None:
    """Node 0 at s3://b/run, node 1 at s3://b/run/node-1, a layout where any folder is a
    checkpoint: node 1's objects and manifests are not node 0's orphans."""
    b = LocalBackend(tmp_path)
    dcp = layout_for("torch-dcp")
    put(b, "node-1/step_1/w.bin", 3 * DAY)
    put(b, "node-1/.ckpt-sidecar/manifests/step_1.json", 3 * DAY, b"{}")
    put(b, "step_7/w.bin", 3 * DAY)  # node 0's own orphan
    result = sweep_orphans(b, dcp, older_than=DAY)
    assert result.deleted == ("step_7/w.bin",)
    assert keys(b) == {"node-1/step_1/w.bin", "node-1/.ckpt-sidecar/manifests/step_1.json"}
