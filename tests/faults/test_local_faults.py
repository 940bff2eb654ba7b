"""Local faults: rotation, rewrites during upload, a lost root, a full destination, many files."""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.e2e.harness import Daemon, assert_invariant, checkpoint_is, write_atomic

SLOW = {"CKPT_SIDECAR_UPLOAD__MAX_BANDWIDTH_BYTES_PER_SECOND": str(2 * 1024 * 1024)}


def test_rotation_deletes_a_checkpoint_while_it_uploads(
    dirs: tuple[Path, Path],
    daemons: list[Daemon],
) -> None:
    watch, remote = dirs
    d = Daemon(watch, f"file://{remote}", env=SLOW)
    daemons.append(d)
    d.wait_for("daemon.ready")
    old = watch / "step_1"
    old.mkdir()
    for i in range(4):
        (old / f"shard{i}.bin").write_bytes(os.urandom(2 * 1024 * 1024))
    d.wait_for("checkpoint.ready", where=checkpoint_is("step_1"))
    shutil.rmtree(old)  # the trainer rotates it away mid-upload
    write_atomic(watch / "step_2.pt", os.urandom(100_000))
    d.wait_for("checkpoint.vanished", where=checkpoint_is("step_1"))
    d.wait_for("checkpoint.committed", where=checkpoint_is("step_2.pt"))
    assert {m.name for m in assert_invariant(remote)} == {"step_2.pt"}
    assert d.proc.poll() is None
    assert d.terminate() == 0


def test_file_rewritten_during_upload_is_never_committed_half(
    dirs: tuple[Path, Path],
    daemons: list[Daemon],
) -> None:
    watch, remote = dirs
    d = Daemon(watch, f"file://{remote}", env=SLOW)
    daemons.append(d)
    d.wait_for("daemon.ready")
    first = os.urandom(4 * 1024 * 1024)
    write_atomic(watch / "model_3.pt", first)
    d.wait_for("checkpoint.ready")
    final = os.urandom(1024 * 1024)
    with open(watch / "model_3.pt", "r+b") as f:  # truncated and rewritten in place
        f.truncate(0)
        f.write(final)
    d.wait_for("checkpoint.changed", where=checkpoint_is("model_3.pt"))
    ev = d.wait_for("checkpoint.committed", where=checkpoint_is("model_3.pt"))
    assert ev["bytes"] == len(final)
    (m,) = assert_invariant(remote)
    assert (remote / m.files[0].key).read_bytes() == final
    assert d.terminate() == 0


def test_watched_folder_deleted_and_recreated(
    dirs: tuple[Path, Path],
    daemons: list[Daemon],
) -> None:
    watch, remote = dirs
    d = Daemon(watch, f"file://{remote}")
    daemons.append(d)
    d.wait_for("daemon.ready")
    shutil.rmtree(watch)
    d.wait_for("watch.root_missing")
    watch.mkdir()
    d.wait_for("watch.root_back")
    write_atomic(watch / "step_9.pt", os.urandom(10_000))
    d.wait_for("checkpoint.committed", where=checkpoint_is("step_9.pt"))
    assert d.terminate() == 0


def test_checkpoint_of_ten_thousand_small_files(
    dirs: tuple[Path, Path],
    daemons: list[Daemon],
) -> None:
    watch, remote = dirs
    d = Daemon(watch, f"file://{remote}", env={"CKPT_SIDECAR_UPLOAD__CONCURRENCY": "16"})
    daemons.append(d)
    d.wait_for("daemon.ready")
    tmp = watch / "step_10.partial"
    for i in range(100):
        sub = tmp / f"layer{i:03d}"
        sub.mkdir(parents=True)
        for j in range(100):
            (sub / f"t{j:03d}.bin").write_bytes(i.to_bytes(2, "big") + j.to_bytes(2, "big"))
    os.replace(tmp, watch / "step_10")
    ev = d.wait_for("checkpoint.committed", timeout=240, where=checkpoint_is("step_10"))
    assert ev["files"] == 10_000
    (m,) = assert_invariant(remote)
    assert len(m.files) == 10_000
    assert d.terminate() == 0


@pytest.fixture
def small_tmpfs(tmp_path: Path) -> Iterator[Path]:
    mnt = tmp_path / "small"
    mnt.mkdir()
    r = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=6m", "tmpfs", str(mnt)], capture_output=True, text=True
    )
    if r.returncode != 0:
        pytest.skip(f"cannot mount a small tmpfs here ({r.stderr.strip()}); needs root")
    try:
        yield mnt
    finally:
        subprocess.run(["umount", "-l", str(mnt)], capture_output=True)


def test_full_destination_is_retried_until_space_returns(
    tmp_path: Path,
    daemons: list[Daemon],
    small_tmpfs: Path,
) -> None:
    watch = tmp_path / "w"
    watch.mkdir()
    remote = small_tmpfs / "remote"
    filler = small_tmpfs / "filler"
    filler.write_bytes(b"\0" * (5 * 1024 * 1024))
    d = Daemon(
        watch,
        f"file://{remote}",
        env={
            "CKPT_SIDECAR_UPLOAD__BACKOFF_INITIAL_SECONDS": "0.1",
            "CKPT_SIDECAR_UPLOAD__BACKOFF_MAX_SECONDS": "0.5",
            "CKPT_SIDECAR_UPLOAD__MAX_ATTEMPTS": "3",
        },
    )
    daemons.append(d)
    d.wait_for("daemon.ready")
    data = os.urandom(3 * 1024 * 1024)
    write_atomic(watch / "step_1.pt", data)
    retry = d.wait_for("upload.retry")
    assert "full" in retry["error"]
    d.wait_for("checkpoint.upload_failed")
    assert assert_invariant(remote) == []  # nothing committed while the disk is full
    filler.unlink()
    d.wait_for("checkpoint.committed", timeout=60, where=checkpoint_is("step_1.pt"))
    assert len(assert_invariant(remote)) == 1
    assert (remote / "step_1.pt").read_bytes() == data
    assert d.terminate() == 0
