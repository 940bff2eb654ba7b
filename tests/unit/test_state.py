"""The local state cache: (path, size, mtime_ns, inode) -> CRC32C, a cache that never lies."""

from __future__ import annotations

import json
import os
import threading
from pathlib import Path

import pytest
from structlog.testing import capture_logs

from sidecar.model import FileState
from sidecar.state import StateCache
from sidecar.watch.scan import state_of


def make(tmp_path: Path, name: str, data: bytes) -> tuple[Path, FileState]:
    p = tmp_path / name
    p.write_bytes(data)
    return p, state_of(os.lstat(p))


def test_hit_only_when_size_mtime_and_inode_all_match(tmp_path: Path) -> None:
    c = StateCache(tmp_path / "state")
    p, st = make(tmp_path, "a.pt", b"abc")
    c.put(p, st, "CRC=")
    assert c.get(p, st) == "CRC="
    assert c.get(p, FileState(st.size + 1, st.mtime_ns, st.inode)) is None
    assert c.get(p, FileState(st.size, st.mtime_ns + 1, st.inode)) is None
    assert c.get(p, FileState(st.size, st.mtime_ns, st.inode + 1)) is None
    assert c.get(tmp_path / "other.pt", st) is None


def test_survives_a_restart(tmp_path: Path) -> None:
    folder = tmp_path / "state"
    c = StateCache(folder)
    p, st = make(tmp_path, "a.pt", b"abc")
    c.put(p, st, "AAAAAA==")
    c.save()
    assert StateCache(folder).get(p, st) == "AAAAAA=="
    assert [x.name for x in folder.iterdir()] == ["files.json"], "no temporary file left"
    json.loads((folder / "files.json").read_text())


def test_save_forgets_files_that_are_gone(tmp_path: Path) -> None:
    folder = tmp_path / "state"
    c = StateCache(folder)
    keep, st_keep = make(tmp_path, "keep.pt", b"k")
    gone, st_gone = make(tmp_path, "gone.pt", b"g")
    c.put(keep, st_keep, "K")
    c.put(gone, st_gone, "G")
    gone.unlink()
    c.save()
    saved = json.loads((folder / "files.json").read_text())
    assert list(saved) == [str(keep)]


def test_rewritten_file_is_a_miss_after_restart(tmp_path: Path) -> None:
    folder = tmp_path / "state"
    c = StateCache(folder)
    p, st = make(tmp_path, "a.pt", b"first")
    c.put(p, st, "X")
    c.save()
    p.write_bytes(b"second, longer")
    assert StateCache(folder).get(p, state_of(os.lstat(p))) is None


@pytest.mark.parametrize(
    "content",
    [
        "not json at all",
        '{"/x": [1, 2, 3]}',
        '{"/x": 5}',
        '{"/x": ["a", "b", "c", "d"]}',
        "",
    ],
)
def test_corrupt_state_file_is_logged_and_ignored(tmp_path: Path, content: str) -> None:
    folder = tmp_path / "state"
    folder.mkdir()
    (folder / "files.json").write_text(content)
    with capture_logs() as logs:
        c = StateCache(folder)
    assert c.get(Path("/x"), FileState(1, 2, 3)) is None
    assert any(e["event"] == "state.unreadable" for e in logs)


@pytest.mark.parametrize("content", ["[]", "null", "3"])
def test_state_file_that_is_json_but_not_an_object_is_ignored(tmp_path: Path, content: str) -> None:
    folder = tmp_path / "state"
    folder.mkdir()
    (folder / "files.json").write_text(content)
    c = StateCache(folder)
    assert c.get(Path("/x"), FileState(1, 2, 3)) is None


def test_save_failure_is_logged_not_raised(tmp_path: Path) -> None:
    blocker = tmp_path / "state"
    blocker.write_text("a file where the folder should be")
    c = StateCache(blocker / "sub")
    p, st = make(tmp_path, "a.pt", b"a")
    c.put(p, st, "A")
    with capture_logs() as logs:
        c.save()
    assert any(e["event"] == "state.save_failed" for e in logs)


def test_no_folder_means_memory_only(tmp_path: Path) -> None:
    c = StateCache(None)
    p, st = make(tmp_path, "a.pt", b"a")
    c.put(p, st, "A")
    c.save()
    assert c.get(p, st) == "A"
    assert sorted(x.name for x in tmp_path.iterdir()) == ["a.pt"]


def test_concurrent_puts_are_all_kept(tmp_path: Path) -> None:
    folder = tmp_path / "state"
    c = StateCache(folder)
    paths = [make(tmp_path, f"f{i}.pt", bytes([i])) for i in range(40)]

    def worker(chunk: list[tuple[Path, FileState]]) -> None:
        for p, st in chunk:
            c.put(p, st, p.name)

    threads = [threading.Thread(target=worker, args=(paths[i::4],)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    c.save()
    again = StateCache(folder)
    assert all(again.get(p, st) == p.name for p, st in paths)
