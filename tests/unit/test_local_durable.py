"""The file:// backend makes every folder it creates durable in its parent, so after a crash
a committed file is never left in a folder whose name was lost."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from sidecar.storage.local import LocalBackend


def test_each_new_folder_is_fsynced_in_its_parent(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    src = tmp_path / "w.bin"
    src.write_bytes(b"weights")
    root = tmp_path / "remote"
    root.mkdir()
    synced: list[str] = []
    fsync = os.fsync

    def recording(fd: int) -> None:
        synced.append(os.readlink(f"/proc/self/fd/{fd}"))
        fsync(fd)

    monkeypatch.setattr(os, "fsync", recording)
    LocalBackend(root).put_file("step_1/sub/w.bin", src)
    for folder in (root, root / "step_1", root / "step_1" / "sub"):
        assert str(folder) in synced, f"{folder} not fsynced"
