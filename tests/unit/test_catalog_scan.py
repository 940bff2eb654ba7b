"""The catalog of committed manifests, and lstat snapshots of entries."""

from __future__ import annotations

import json
import os
import threading
import uuid
from pathlib import Path

from sidecar.catalog import Catalog
from sidecar.manifest import LATEST_KEY, MANIFEST_PREFIX, Manifest, ManifestFile
from sidecar.storage.checksum import crc32c_of_bytes
from sidecar.storage.memory import MemoryBackend
from sidecar.watch.scan import scan_entry

CRC = crc32c_of_bytes(b"x")


def man(name: str, gen: int, step: int | None, seq: int) -> Manifest:
    f = ManifestFile("w", f"{name}/w", 1, CRC)
    return Manifest(name, gen, "plain", True, step, seq, "", "", "h", "v", (f,))


def test_load_reads_every_valid_manifest_and_reports_the_rest() -> None:
    b = MemoryBackend(f"cat-{uuid.uuid4().hex}")
    good = [man("step_1", 0, 1, 0), man("step_2", 0, 2, 1), man("last.ckpt", 1, None, 2)]
    for m in good:
        b.put_bytes(m.key, m.to_json())
    b.put_bytes(".ckpt-sidecar/manifests/broken.json", b"{")
    b.put_bytes(".ckpt-sidecar/manifests/misnamed.json", man("other", 0, 3, 3).to_json())
    b.put_bytes(".ckpt-sidecar/manifests/notes.txt", b"ignored")
    bad: list[tuple[str, str]] = []
    cat = Catalog.load(b, on_invalid=lambda k, r: bad.append((k, r)))
    assert [m.name for m in cat.all()] == ["step_2", "step_1", "last.ckpt"]
    assert sorted(k for k, _ in bad) == [
        ".ckpt-sidecar/manifests/broken.json",
        ".ckpt-sidecar/manifests/misnamed.json",
    ]
    assert all(r for _, r in bad), "every refusal says why"


def test_latest_for_newest_and_sequence() -> None:
    cat = Catalog()
    assert cat.newest() is None and cat.next_sequence() == 0
    for m in (man("last.ckpt", 0, None, 0), man("last.ckpt", 2, None, 5), man("s_9", 0, 9, 1)):
        cat.add(m)
    latest = cat.latest_for("last.ckpt")
    assert latest is not None and latest.generation == 2
    assert cat.latest_for("nope") is None
    newest = cat.newest()
    assert newest is not None and newest.name == "s_9", "a step beats no step"
    assert cat.next_sequence() == 6
    cat.remove(newest)
    assert [m.name for m in cat.all()] == ["last.ckpt", "last.ckpt"]
    cat.add_sequence_floor(40)
    assert cat.next_sequence() == 41


def test_latest_pointer_raises_the_sequence_floor() -> None:
    b = MemoryBackend(f"cat-{uuid.uuid4().hex}")
    m = man("s_1", 0, 1, 3)
    b.put_bytes(m.key, m.to_json())
    b.put_bytes(LATEST_KEY, json.dumps({"sequence": 17}).encode())
    assert Catalog.load(b).next_sequence() == 18
    b.put_bytes(LATEST_KEY, b"garbage")
    assert Catalog.load(b).next_sequence() == 4


# -- scan ------------------------------------------------------------------------------------
def test_scan_lists_regular_files_relative_and_skips_symlinks(tmp_path: Path) -> None:
    d = tmp_path / "step_1"
    (d / "a" / "b").mkdir(parents=True)
    (d / "top.pt").write_bytes(b"12345")
    (d / "a" / "b" / "deep.pt").write_bytes(b"1")
    (d / "link.pt").symlink_to(d / "top.pt")
    os.mkfifo(d / "pipe")
    seen: list[Path] = []
    snap = scan_entry(d, seen.append)
    assert snap is not None
    assert sorted(snap) == ["a/b/deep.pt", "top.pt"]
    assert snap["top.pt"].size == 5
    assert snap["top.pt"].inode == (d / "top.pt").stat().st_ino
    assert seen == [d / "link.pt"]


def test_scan_of_a_file_a_symlink_and_nothing(tmp_path: Path) -> None:
    f = tmp_path / "m.pt"
    f.write_bytes(b"abc")
    snap = scan_entry(f)
    assert snap is not None and list(snap) == ["m.pt"] and snap["m.pt"].size == 3
    link = tmp_path / "l.pt"
    link.symlink_to(f)
    seen: list[Path] = []
    assert scan_entry(link, seen.append) is None
    assert seen == [link]
    assert scan_entry(tmp_path / "missing") is None


class _MeetInPairs(MemoryBackend):
    """Each manifest read waits until another read is in progress at the same time: a
    catalog that reads one manifest after another breaks the barrier and fails."""

    def __init__(self, name: str) -> None:
        super().__init__(name)
        self.barrier = threading.Barrier(2, timeout=10)

    def get_bytes(self, key: str) -> bytes:
        if key.startswith(MANIFEST_PREFIX):
            self.barrier.wait()
        return super().get_bytes(key)


def test_manifests_are_read_concurrently() -> None:
    b = _MeetInPairs(f"cat-{uuid.uuid4().hex}")
    for i in range(10):
        m = man(f"step_{i}", 0, i, i)
        b.put_bytes(m.key, m.to_json())
    assert [m.name for m in Catalog.load(b).all()] == [f"step_{i}" for i in range(9, -1, -1)]
