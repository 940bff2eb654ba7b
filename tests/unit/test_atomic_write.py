"""Small files written in folders other processes can write to: all or nothing, never
through a symlink planted there, readable by others as the umask allows."""

from __future__ import annotations

import errno
import os
import secrets
import stat
from collections.abc import Callable
from pathlib import Path

import pytest

from sidecar import atomic_write
from sidecar.atomic_write import write_atomically


def test_content_replaced_whole_and_no_temporary_left(tmp_path: Path) -> None:
    (tmp_path / "n.json").write_bytes(b"old")
    write_atomically(tmp_path, "n.json", b"new")
    assert (tmp_path / "n.json").read_bytes() == b"new"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["n.json"]


def test_a_symlink_at_the_name_is_replaced_not_followed(tmp_path: Path) -> None:
    victim = tmp_path / "victim"
    victim.write_bytes(b"untouched")
    (tmp_path / "box").mkdir()
    (tmp_path / "box" / "n.json").symlink_to(victim)
    write_atomically(tmp_path / "box", "n.json", b"new")
    assert victim.read_bytes() == b"untouched"
    assert not (tmp_path / "box" / "n.json").is_symlink()


def test_a_symlink_at_the_temporary_name_is_never_written_through(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    victim = tmp_path / "victim"
    victim.write_bytes(b"untouched")
    monkeypatch.setattr(secrets, "token_hex", lambda n: "guessed")
    (tmp_path / ".n.json.guessed.ckpt-sidecar-tmp").symlink_to(victim)
    with pytest.raises(FileExistsError):
        write_atomically(tmp_path, "n.json", b"new")
    assert victim.read_bytes() == b"untouched"
    assert not (tmp_path / "n.json").exists()


def test_the_umask_decides_who_may_read_it(tmp_path: Path) -> None:
    old = os.umask(0o022)
    try:
        write_atomically(tmp_path, "n.json", b"{}")
    finally:
        os.umask(old)
    assert stat.S_IMODE((tmp_path / "n.json").stat().st_mode) == 0o644  # the trainer reads it


def test_a_failed_write_leaves_nothing_behind(tmp_path: Path) -> None:
    with pytest.raises(OSError):
        write_atomically(tmp_path / "missing", "n.json", b"{}")
    assert list(tmp_path.iterdir()) == []


def test_a_mount_that_cannot_sync_a_folder_still_takes_the_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Some FUSE and SMB mounts answer fsync(2) of a folder with EINVAL: the notice file,
    the state cache and restore's pointer are written all the same."""
    real = atomic_write.fsync_path

    def files_only(path: Path) -> None:
        if path.is_dir():
            raise OSError(errno.EINVAL, "Invalid argument")
        real(path)

    monkeypatch.setattr(atomic_write, "fsync_path", files_only)
    write_atomically(tmp_path, "notice.json", b"{}")
    assert (tmp_path / "notice.json").read_bytes() == b"{}"
    monkeypatch.setattr(atomic_write, "fsync_path", _raise(errno.EIO))
    with pytest.raises(OSError, match="I/O"):
        atomic_write.fsync_folder(tmp_path)  # a real failure still is one


def _raise(code: int) -> Callable[[Path], None]:
    def fail(path: Path) -> None:
        raise OSError(code, "I/O error")

    return fail
