"""CompletionTracker driven directly: real files in tmp_path, a fake monotonic clock.

Events are fed the way ``Watcher._feed`` feeds them from the inotify source
(``moved`` becomes ``deleted`` + ``moved_in``; directory ``modified`` is dropped).
"""

from __future__ import annotations

import itertools
import os
import time
from pathlib import Path
from typing import Any

import pytest
from structlog.testing import capture_logs

from sidecar.model import CheckpointReady, EntryKind
from sidecar.watch.completion import CompletionTracker
from sidecar.watch.layouts import layout_for

SETTLE = 1.0


class Clock:
    def __init__(self, start: float = 1000.0) -> None:
        self.now = start

    def __call__(self) -> float:
        return self.now

    def advance(self, dt: float) -> None:
        self.now += dt


def tracker(
    root: Path,
    clock: Clock,
    layout: str = "plain",
    *,
    poll: bool = False,
    other: bool = True,
    marker: str | None = None,
    symlinks: list[Path] | None = None,
) -> CompletionTracker:
    return CompletionTracker(
        root,
        layout_for(layout, marker=marker),
        settle_seconds=SETTLE,
        other_files=other,
        other_interval_seconds=3600.0,
        poll_mode=poll,
        clock=clock,
        wall=lambda: 1.7e9,
        on_symlink=(symlinks.append if symlinks is not None else None),
    )


def names(items: list[CheckpointReady]) -> list[str]:
    return [i.name for i in items]


def run_for(t: CompletionTracker, clock: Clock, seconds: float) -> list[CheckpointReady]:
    """Tick every 0.1 s of fake time for ``seconds``; collect every hand-off."""
    out: list[CheckpointReady] = []
    steps = round(seconds / 0.1)
    for _ in range(steps):
        clock.advance(0.1)
        out += t.tick()
    return out


# -- single-file checkpoints -------------------------------------------------------------
def test_file_closed_after_writing_is_ready_at_once(tmp_path: Path) -> None:
    clock = Clock()
    t = tracker(tmp_path, clock)
    p = tmp_path / "ckpt_100.pt"
    with open(p, "wb") as f:
        t.event(p, "created")
        t.event(p, "opened")
        f.write(b"x" * 1000)
        assert t.tick() == []
        clock.advance(5 * SETTLE)
        assert t.tick() == [], "a file open for writing is never complete"
    t.event(p, "closed")
    clock.advance(0.11)
    [item] = t.tick()
    assert item.name == "ckpt_100.pt"
    assert item.kind is EntryKind.CHECKPOINT
    assert not item.is_dir
    assert item.step == 100
    assert [f.rel for f in item.files] == ["ckpt_100.pt"]
    assert item.files[0].state.size == 1000
    assert item.size == 1000


def test_temp_name_renamed_into_place(tmp_path: Path) -> None:
    clock = Clock()
    t = tracker(tmp_path, clock)
    tmp = tmp_path / "ckpt_7.pt.tmp"
    with open(tmp, "wb") as f:
        t.event(tmp, "created")
        t.event(tmp, "opened")
        f.write(b"abc")
    t.event(tmp, "closed")
    assert run_for(t, clock, 3) == [], "a temporary name is never handed off as itself"
    final = tmp_path / "ckpt_7.pt"
    os.rename(tmp, final)
    t.event(tmp, "deleted")
    t.event(final, "moved_in")
    clock.advance(0.11)
    assert names(t.tick()) == ["ckpt_7.pt"]


def test_handle_opened_under_a_temporary_folder_name_follows_the_rename(tmp_path: Path) -> None:
    """A writer still holding a file when its folder is renamed into place holds it back."""
    clock = Clock()
    t = tracker(tmp_path, clock)
    tmp = tmp_path / "step_3.partial"
    tmp.mkdir()
    (tmp / "a.bin").write_bytes(b"a")
    t.event(tmp, "created", is_dir=True)
    t.event(tmp / "a.bin", "created")
    t.event(tmp / "a.bin", "opened")
    final = tmp_path / "step_3"
    os.rename(tmp, final)
    t.moved(tmp, final)
    t.event(tmp, "deleted", is_dir=True)
    t.event(final, "moved_in", is_dir=True)
    assert run_for(t, clock, SETTLE * 3) == [], "the writer's handle is still open"
    t.event(final / "a.bin", "closed")
    assert names(run_for(t, clock, SETTLE + 0.3)) == ["step_3"]


def test_a_close_merged_away_holds_an_unchanged_file_only_for_the_open_hold(
    tmp_path: Path,
) -> None:
    """Two readers closed one file back to back and inotify merged the two close events:
    the count says one handle is open. The file is handed off once it has stood unchanged
    for the hold (60 s with settle_seconds 1), not never."""
    clock = Clock()
    t = tracker(tmp_path, clock)
    tmp = tmp_path / "model_7.pt.tmp"
    tmp.write_bytes(b"m" * 100)
    t.event(tmp, "opened")
    t.event(tmp, "opened")
    t.event(tmp, "closed_no_write")  # the second close was merged into this one
    final = tmp_path / "model_7.pt"
    os.rename(tmp, final)
    t.moved(tmp, final)
    t.event(tmp, "deleted")
    t.event(final, "moved_in")
    with capture_logs() as logs:
        assert run_for(t, clock, 59) == [], "held while a handle may be open"
        assert not logs
        got = run_for(t, clock, 1.5)
    assert names(got) == ["model_7.pt"]
    assert [e["event"] for e in logs] == ["watch.open_handles_dropped"]
    assert logs[0]["entry"] == "model_7.pt" and logs[0]["files"] == 1


def test_a_file_open_and_still_changing_is_held_past_the_open_hold(tmp_path: Path) -> None:
    """The hold counts unchanged time: a writer that writes every 5 s (pauses longer than
    settle_seconds, shorter than the hold) is never cut short, however long it writes."""
    clock = Clock()
    t = tracker(tmp_path, clock)
    p = tmp_path / "model_8.pt"
    p.write_bytes(b"")
    t.event(p, "created")
    t.event(p, "opened")
    got: list[CheckpointReady] = []
    with open(p, "ab") as f:
        for _ in range(30):  # 150 s of fake time, more than twice the hold
            f.write(b"w" * 10)
            f.flush()
            got += run_for(t, clock, 5.0)
    assert got == [], "handed off while its writer was still writing"
    t.event(p, "closed")
    assert names(run_for(t, clock, 0.3)) == ["model_8.pt"]


def test_folder_renamed_into_place_is_looked_at_again_only_when_settled(tmp_path: Path) -> None:
    """A rename makes a single file complete at once; a folder still waits settle_seconds,
    and in that time it is not scanned again and again (10,000 files each time)."""
    clock = Clock()
    t = tracker(tmp_path, clock)
    stage = tmp_path / "step_4.partial"
    stage.mkdir()
    for i in range(3):
        (stage / f"{i}.bin").write_bytes(b"x")
    final = tmp_path / "step_4"
    os.rename(stage, final)
    t.moved(stage, final)
    t.event(stage, "deleted", is_dir=True)
    t.event(final, "moved_in", is_dir=True)
    clock.advance(0.1)
    assert t.tick() == []
    assert t.next_deadline() == clock.now + SETTLE
    clock.advance(SETTLE)
    assert names(t.tick()) == ["step_4"]


def test_file_without_close_event_becomes_ready_once_stable(tmp_path: Path) -> None:
    clock = Clock()
    t = tracker(tmp_path, clock)
    p = tmp_path / "weights.safetensors"
    p.write_bytes(b"w")
    t.event(p, "created")
    clock.advance(0.1)
    assert t.tick() == []
    got = run_for(t, clock, SETTLE + 0.3)
    assert names(got) == ["weights.safetensors"]


def test_same_snapshot_is_not_handed_off_twice_but_a_new_one_is(tmp_path: Path) -> None:
    clock = Clock()
    t = tracker(tmp_path, clock)
    p = tmp_path / "last.ckpt"
    p.write_bytes(b"one")
    t.event(p, "closed")
    clock.advance(0.2)
    assert names(t.tick()) == ["last.ckpt"]
    t.event(p, "closed_no_write")  # our own uploader reading it
    assert run_for(t, clock, 3) == []
    p.write_bytes(b"two!")
    t.event(p, "closed")
    clock.advance(0.2)
    [again] = t.tick()
    assert again.files[0].state.size == 4
    assert again.step is None


def test_reader_open_close_does_not_block_or_release_a_writer(tmp_path: Path) -> None:
    clock = Clock()
    t = tracker(tmp_path, clock)
    p = tmp_path / "m.pt"
    with open(p, "wb") as w:
        t.event(p, "created")
        t.event(p, "opened")
        w.write(b"1")
        t.event(p, "opened")  # a reader
        t.event(p, "closed_no_write")
        assert run_for(t, clock, 3) == [], "writer still open"
    t.event(p, "closed")
    clock.advance(0.2)
    assert names(t.tick()) == ["m.pt"]


def test_deleted_entry_is_forgotten(tmp_path: Path) -> None:
    clock = Clock()
    t = tracker(tmp_path, clock)
    p = tmp_path / "a.pt"
    p.write_bytes(b"a")
    t.event(p, "created")
    p.unlink()
    t.event(p, "deleted")
    assert run_for(t, clock, 3) == []
    assert t.entries == {}
    assert t.next_deadline() is None


# -- directories -------------------------------------------------------------------------
def _write_dir(root: Path, t: CompletionTracker, name: str, files: dict[str, bytes]) -> Path:
    d = root / name
    d.mkdir(exist_ok=True)
    t.event(d, "created", is_dir=True)
    for rel, data in files.items():
        p = d / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        t.event(p, "created")
        t.event(p, "opened")
        p.write_bytes(data)
        t.event(p, "closed")
    return d


def test_plain_folder_waits_for_settle_and_resets_on_change(tmp_path: Path) -> None:
    clock = Clock()
    t = tracker(tmp_path, clock)
    d = _write_dir(tmp_path, t, "step_300", {"model.pt": b"m" * 10, "sub/opt.pt": b"o"})
    clock.advance(0.1)
    assert t.tick() == []
    clock.advance(SETTLE * 0.6)
    assert t.tick() == []
    (d / "extra.pt").write_bytes(b"e")
    t.event(d / "extra.pt", "closed")
    clock.advance(SETTLE * 0.6)
    assert t.tick() == [], "a change restarts the settle time"
    got = run_for(t, clock, SETTLE + 0.3)
    [item] = got
    assert item.name == "step_300" and item.is_dir and item.step == 300
    assert [f.rel for f in item.files] == ["extra.pt", "model.pt", "sub/opt.pt"]
    assert {f.path for f in item.files} == {d / "extra.pt", d / "model.pt", d / "sub/opt.pt"}
    assert item.size == 12


def test_folder_with_open_file_is_not_ready_however_long(tmp_path: Path) -> None:
    clock = Clock()
    t = tracker(tmp_path, clock)
    d = _write_dir(tmp_path, t, "step_1", {"a.pt": b"a"})
    p = d / "b.pt"
    with open(p, "wb") as f:
        t.event(p, "created")
        t.event(p, "opened")
        f.write(b"b")
        assert run_for(t, clock, 10 * SETTLE) == []
    t.event(p, "closed")
    got = run_for(t, clock, SETTLE + 0.3)
    assert names(got) == ["step_1"]


def test_folder_with_temporary_file_inside_waits_for_the_rename(tmp_path: Path) -> None:
    clock = Clock()
    t = tracker(tmp_path, clock)
    d = _write_dir(tmp_path, t, "checkpoint_2", {"a.bin": b"a", "b.bin.partial": b"b"})
    assert run_for(t, clock, 3 * SETTLE) == []
    os.rename(d / "b.bin.partial", d / "b.bin")
    t.event(d / "b.bin.partial", "deleted")
    t.event(d / "b.bin", "moved_in")
    got = run_for(t, clock, SETTLE + 0.3)
    assert [f.rel for f in got[0].files] == ["a.bin", "b.bin"]


def test_torch_dcp_ready_when_metadata_lands_without_settle(tmp_path: Path) -> None:
    clock = Clock()
    t = tracker(tmp_path, clock, "torch-dcp")
    d = _write_dir(tmp_path, t, "step-40", {"__0_0.distcp": b"s0", "__1_0.distcp": b"s1"})
    assert run_for(t, clock, 3 * SETTLE) == []
    (d / ".metadata").write_bytes(b"meta")
    t.event(d / ".metadata", "closed")
    clock.advance(0.11)
    [item] = t.tick()
    assert item.layout == "torch-dcp"
    assert item.step == 40
    assert ".metadata" in [f.rel for f in item.files]


def test_deepspeed_latest_pointer_completes_the_named_step(tmp_path: Path) -> None:
    clock = Clock()
    t = tracker(tmp_path, clock, "deepspeed")
    _write_dir(tmp_path, t, "global_step10", {"mp_rank_00_model_states.pt": b"x"})
    assert run_for(t, clock, 3 * SETTLE) == []
    latest = tmp_path / "latest"
    latest.write_text("global_step10")
    t.event(latest, "closed")
    got = run_for(t, clock, SETTLE + 0.3)
    assert names(got) == ["global_step10"]
    assert got[0].step == 10


def test_marker_layout(tmp_path: Path) -> None:
    clock = Clock()
    t = tracker(tmp_path, clock, "marker", marker="DONE")
    d = _write_dir(tmp_path, t, "run_a", {"w.bin": b"w"})
    assert run_for(t, clock, 3 * SETTLE) == []
    (d / "DONE").write_bytes(b"")
    t.event(d / "DONE", "closed")
    clock.advance(0.11)
    assert names(t.tick()) == ["run_a"]


# -- names that are ignored, other files -------------------------------------------------
def test_hidden_and_temporary_top_level_names_are_ignored(tmp_path: Path) -> None:
    clock = Clock()
    t = tracker(tmp_path, clock)
    for n in (".ckpt-sidecar-notice.json", ".hidden.pt", "x.pt.tmp", "5.orbax-checkpoint-tmp-1"):
        p = tmp_path / n
        p.write_bytes(b"z")
        t.event(p, "closed")
    t.rescan_all()
    assert run_for(t, clock, 3 * SETTLE) == []
    assert t.entries == {}


def test_other_files_synced_one_by_one(tmp_path: Path) -> None:
    clock = Clock()
    t = tracker(tmp_path, clock)
    (tmp_path / "logs").mkdir()
    log = tmp_path / "logs" / "train.log"
    log.write_text("line\n")
    t.event(log, "closed")
    clock.advance(0.2)
    [item] = t.tick()
    assert item.kind is EntryKind.OTHER
    assert item.name == "logs/train.log"
    assert item.step is None


def test_other_file_held_open_and_written_is_synced_every_interval(tmp_path: Path) -> None:
    """A log the trainer keeps open and appends to is not "closed" nor "stable": it goes as
    a snapshot every other_files.interval_seconds (here 5 s), its open handle holding nothing."""
    clock = Clock()
    t = CompletionTracker(
        tmp_path,
        layout_for("plain"),
        settle_seconds=SETTLE,
        other_interval_seconds=5.0,
        clock=clock,
        wall=lambda: 1.7e9,
    )
    log = tmp_path / "train.log"
    got: list[tuple[float, int]] = []
    with open(log, "a") as f:
        t.event(log, "created")
        t.event(log, "opened")
        for i in range(20):  # 20 s of fake time, a line every second
            f.write(f"step {i}\n")
            f.flush()
            for _ in range(10):
                clock.advance(0.1)
                got += [(clock.now, item.files[0].state.size) for item in t.tick()]
    assert len(got) >= 3, f"an open, growing log was synced {len(got)} times in 20 s"
    times = [at for at, _ in got]
    assert all(b - a >= 5.0 - 1e-9 for a, b in itertools.pairwise(times))
    sizes = [size for _, size in got]
    assert sizes == sorted(sizes) and sizes[0] < sizes[-1], "each snapshot is the log so far"


def test_other_files_disabled_hands_off_nothing(tmp_path: Path) -> None:
    clock = Clock()
    t = tracker(tmp_path, clock, other=False)
    p = tmp_path / "config.yaml"
    p.write_text("a: 1\n")
    t.event(p, "closed")
    t.rescan_all()
    assert run_for(t, clock, 3 * SETTLE) == []


# -- start-up, polling -------------------------------------------------------------------
def test_existing_content_at_start_is_handed_off_once_stable(tmp_path: Path) -> None:
    (tmp_path / "step_5").mkdir()
    (tmp_path / "step_5" / "w.pt").write_bytes(b"w")
    (tmp_path / "old.pt").write_bytes(b"o")
    clock = Clock()
    t = tracker(tmp_path, clock)
    t.rescan_all()
    clock.advance(0.1)
    assert t.tick() == [], "not before it has stood still for settle_seconds"
    got = run_for(t, clock, SETTLE + 0.3)
    assert sorted(names(got)) == ["old.pt", "step_5"]


def test_poll_mode_needs_two_scans_settle_apart(tmp_path: Path) -> None:
    clock = Clock()
    t = tracker(tmp_path, clock, poll=True)
    p = tmp_path / "ckpt_3.pt"
    p.write_bytes(b"a")
    t.rescan_all()
    assert t.tick() == []
    for i in range(5):  # keeps growing: never ready
        clock.advance(SETTLE * 0.9)
        with open(p, "ab") as f:
            f.write(b"b" * (i + 1))
        t.rescan_all()
        assert t.tick() == []
    clock.advance(SETTLE * 0.5)
    t.rescan_all()
    assert t.tick() == []
    clock.advance(SETTLE * 0.6)
    t.rescan_all()
    assert names(t.tick()) == ["ckpt_3.pt"]


def test_poll_mode_replaced_file_with_same_size_counts_as_change(tmp_path: Path) -> None:
    clock = Clock()
    t = tracker(tmp_path, clock, poll=True)
    p = tmp_path / "ckpt_3.pt"
    p.write_bytes(b"aaaa")
    t.rescan_all()
    t.tick()
    st = p.stat()
    clock.advance(SETTLE * 0.9)
    other = tmp_path / "swap.tmp"
    other.write_bytes(b"bbbb")
    os.utime(other, ns=(st.st_atime_ns, st.st_mtime_ns))
    os.replace(other, p)
    assert p.stat().st_ino != st.st_ino
    t.rescan_all()
    assert t.tick() == []
    clock.advance(SETTLE * 0.5)
    t.rescan_all()
    assert t.tick() == [], "a new inode restarts the settle time"


# -- symlinks, re-hand-off ---------------------------------------------------------------
def test_symlinks_are_not_followed_out_of_the_root(tmp_path: Path) -> None:
    root = tmp_path / "root"
    outside = tmp_path / "outside"
    root.mkdir()
    outside.mkdir()
    (outside / "secret.pt").write_bytes(b"secret")
    (root / "step_9").symlink_to(outside, target_is_directory=True)
    (root / "step_8").mkdir()
    (root / "step_8" / "w.pt").write_bytes(b"w")
    (root / "step_8" / "leak.pt").symlink_to(outside / "secret.pt")
    seen: list[Path] = []
    clock = Clock()
    t = tracker(root, clock, symlinks=seen)
    t.rescan_all()
    got = run_for(t, clock, SETTLE + 0.3)
    assert names(got) == ["step_8"]
    assert [f.rel for f in got[0].files] == ["w.pt"]
    assert all(outside not in f.path.parents for f in got[0].files)
    assert root / "step_8" / "leak.pt" in seen


def test_forget_emitted_hands_off_again(tmp_path: Path) -> None:
    clock = Clock()
    t = tracker(tmp_path, clock)
    p = tmp_path / "a.pt"
    p.write_bytes(b"a")
    t.event(p, "closed")
    clock.advance(0.2)
    assert names(t.tick()) == ["a.pt"]
    assert run_for(t, clock, 2) == []
    t.forget_emitted("a.pt")
    assert names(run_for(t, clock, SETTLE + 0.3)) == ["a.pt"]


def test_next_deadline_reports_when_to_look(tmp_path: Path) -> None:
    clock = Clock()
    t = tracker(tmp_path, clock)
    assert t.next_deadline() is None
    d = _write_dir(tmp_path, t, "step_1", {"a.pt": b"a"})
    assert d.is_dir()
    assert t.next_deadline() == clock.now  # never scanned: look now
    t.tick()
    dl = t.next_deadline()
    assert dl is not None and clock.now < dl <= clock.now + SETTLE + 0.01
    run_for(t, clock, SETTLE + 0.3)
    assert t.next_deadline() is None


# -- known bugs, reproduced exactly ------------------------------------------------------
def test_file_renamed_while_still_open_is_not_ready(tmp_path: Path) -> None:
    clock = Clock()
    t = tracker(tmp_path, clock)
    tmp = tmp_path / "ckpt_1.pt"
    final = tmp_path / "ckpt_2.pt"
    with open(tmp, "wb") as f:
        t.event(tmp, "created")
        t.event(tmp, "opened")
        f.write(b"part")
        os.rename(tmp, final)  # inotify reports later writes/close under the new name
        t.moved(tmp, final)  # the watcher's translation of a watchdog "moved" event
        t.event(tmp, "deleted")
        t.event(final, "moved_in")
        clock.advance(0.2)
        assert t.tick() == [], "ckpt_2.pt is still open for writing"


def test_late_close_of_deleted_file_does_not_release_new_writer(tmp_path: Path) -> None:
    clock = Clock()
    t = tracker(tmp_path, clock)
    p = tmp_path / "last.ckpt"
    old = open(p, "wb")  # noqa: SIM115
    t.event(p, "created")
    t.event(p, "opened")
    p.unlink()
    t.event(p, "deleted")
    clock.advance(0.2)
    assert t.tick() == []
    with open(p, "wb") as new:
        t.event(p, "created")
        t.event(p, "opened")
        new.write(b"new")
        old.close()
        t.event(p, "closed")  # the old, deleted file's close, reported under its name
        clock.advance(0.2)
        assert t.tick() == [], "the new last.ckpt is still open for writing"


def _deny(monkeypatch: pytest.MonkeyPatch, denied: Path) -> None:
    """As for a sidecar that is not root: ``denied`` (a folder) cannot be listed, or (a
    file) cannot be read. The tests run as root, which the modes do not stop."""
    scandir, access = os.scandir, os.access

    def guarded_scandir(path: Any = ".") -> Any:
        if Path(path) == denied:
            raise PermissionError(13, "Permission denied", str(path))
        return scandir(path)

    def guarded_access(path: Any, mode: int, **kw: Any) -> bool:
        return Path(path) != denied and access(path, mode, **kw)

    monkeypatch.setattr(os, "scandir", guarded_scandir)
    monkeypatch.setattr(os, "access", guarded_access)


def test_an_unreadable_folder_is_skipped_and_the_rest_still_handed_off(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name in ("lost+found", "step_1", "logs"):
        (tmp_path / name).mkdir()
    (tmp_path / "step_1" / "w.pt").write_bytes(b"w")
    (tmp_path / "logs" / "run.log").write_bytes(b"l")
    _deny(monkeypatch, tmp_path / "lost+found")  # root-owned, mode 0700 on ext4
    clock, told = Clock(), []
    t = tracker(tmp_path, clock)
    t.on_unreadable = lambda path, why: told.append((path, why))
    t.rescan_all()
    got = run_for(t, clock, SETTLE + 0.3)
    assert sorted(names(got)) == ["logs/run.log", "step_1"]
    assert told and told[0][0] == tmp_path / "lost+found" and "fsGroup" in told[0][1]
    looked = len(told)
    run_for(t, clock, 4.0)
    assert len(told) <= looked + 1, "looked at again and again, not every 5 s"


def test_a_checkpoint_with_an_unreadable_file_is_not_handed_off(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "step_2").mkdir()
    (tmp_path / "step_2" / "a.pt").write_bytes(b"a")
    (tmp_path / "step_2" / "b.pt").write_bytes(b"b")
    (tmp_path / "step_3.pt").write_bytes(b"3")
    _deny(monkeypatch, tmp_path / "step_2" / "b.pt")
    clock, told = Clock(), []
    t = tracker(tmp_path, clock)
    t.on_unreadable = lambda path, why: told.append((path, why))
    t.rescan_all()
    assert names(run_for(t, clock, 3 * SETTLE)) == ["step_3.pt"]
    assert {p for p, _ in told} == {tmp_path / "step_2" / "b.pt"}
    deadline = t.next_deadline()
    assert deadline is not None and deadline > clock.now + 1, "scanned again and again"
    monkeypatch.undo()  # the operator fixes the mode: it goes without a new event
    assert names(run_for(t, clock, 5.5)) == ["step_2"]


def test_checkpoint_names_the_store_could_not_hold_are_skipped_with_a_reason(
    tmp_path: Path,
) -> None:
    for name in ("step_1@g1.pt", "step_3.pt"):
        (tmp_path / name).write_bytes(b"x")
    clock, skipped = Clock(), []
    t = tracker(tmp_path, clock)
    t.on_skip = lambda path, why: skipped.append((path.name, why))
    t.rescan_all()
    assert names(run_for(t, clock, SETTLE + 0.3)) == ["step_3.pt"]
    assert dict(skipped) == {"step_1@g1.pt": "a checkpoint name may not contain '@'; rename it"}


def test_in_progress_names_a_save_under_way_and_lets_go_of_one_that_never_completes(
    tmp_path: Path,
) -> None:
    """What a drain waits for: an entry being written; not a folder that never completes (a
    TensorBoard folder under the torch-dcp layout), for longer than ``recent`` after its last
    change; a file held open for writing up to the open hold."""
    clock = Clock()
    t = tracker(tmp_path, clock, layout="torch-dcp")
    (tmp_path / "tb").mkdir()
    (tmp_path / "tb" / "events.1").write_bytes(b"x")
    t.event(tmp_path / "tb" / "events.1", "created")
    assert t.in_progress(5.0) == ["tb"], "seen, not scanned yet"
    t.tick()
    assert t.in_progress(5.0) == ["tb"]
    clock.advance(5.1)
    t.tick()
    assert t.in_progress(5.0) == [], "no .metadata ever: not a save once quiet"

    t = tracker(tmp_path, clock)  # plain: a file open for writing
    p = tmp_path / "step_1.pt"
    with open(p, "wb") as f:
        t.event(p, "created")
        t.event(p, "opened")
        f.write(b"half")
        f.flush()
        t.tick()
        clock.advance(30)
        assert t.tick() == []
        assert t.in_progress(5.0) == ["step_1.pt"], "held open, unchanged for 30 s"
    t.event(p, "closed")
    assert names(t.tick()) == ["step_1.pt"]
    assert t.in_progress(5.0) == [], "handed off"


def test_in_progress_counts_a_save_under_a_temporary_name_until_it_is_renamed(
    tmp_path: Path,
) -> None:
    """``atomic_save`` and Orbax write under a temporary name and rename when whole; the
    daemon's own ``.ckpt-sidecar*`` files are not a save."""
    clock = Clock()
    t = tracker(tmp_path, clock)
    tmp = tmp_path / ".step_2.pt.ab12.tmp"
    tmp.write_bytes(b"half")
    t.event(tmp, "created")
    t.event(tmp, "opened")
    t.event(tmp_path / ".ckpt-sidecar-state" / "files.json", "opened")
    t.event(tmp_path / "..ckpt-sidecar-notice.json.9c1e.ckpt-sidecar-tmp", "opened")
    assert t.in_progress(5.0) == [tmp.name]
    clock.advance(30)  # one long write: no event, but open
    assert t.in_progress(5.0) == [tmp.name]
    t.event(tmp, "closed")
    os.replace(tmp, tmp_path / "step_2.pt")
    t.moved(tmp, tmp_path / "step_2.pt")
    t.event(tmp, "deleted")
    t.event(tmp_path / "step_2.pt", "moved_in")
    assert t.in_progress(5.0) == ["step_2.pt"], "now the entry, until handed off"
    assert names(t.tick()) == ["step_2.pt"]
    assert t.in_progress(5.0) == []


def test_a_folder_emptied_while_held_open_is_not_a_save(tmp_path: Path) -> None:
    clock = Clock()
    t = tracker(tmp_path, clock)
    d = tmp_path / "step_000200"
    d.mkdir()
    f = d / "model.bin"
    f.write_bytes(b"x")
    t.event(f, "created")
    t.event(f, "opened")
    t.tick()
    f.unlink()  # a failed save cleaned up; the close went unseen
    t.event(f, "deleted")
    t.tick()
    assert t.in_progress(5.0) == ["step_000200"], "it just changed"
    clock.advance(5.1)
    t.tick()
    assert t.in_progress(5.0) == [], "not held for the open hold: nothing in it is open"


def test_a_save_under_a_temporary_name_is_seen_without_events_and_logs_are_not_saves(
    tmp_path: Path,
) -> None:
    """Polling mode, or a write begun before the daemon started, gives no event: the file's
    modification time tells. A hidden log kept open, an editor's swap file or a trigger
    file read now and then is not a save."""
    clock = Clock()
    t = tracker(tmp_path, clock, poll=True)
    tmp = tmp_path / ".step_3.pt.77aa.tmp"
    tmp.write_bytes(b"half")  # mtime: now (the tracker's wall clock is fixed; use real time)
    t.wall = time.time
    for name in (".train.log", ".step_3.pt.swp", ".drain-now"):
        (tmp_path / name).write_bytes(b"x")
    t.rescan_all()
    assert t.in_progress(5.0) == [tmp.name]
    old = time.time() - 60
    os.utime(tmp, (old, old))  # nothing written for a minute: given up on
    assert t.in_progress(5.0) == []
    tmp.unlink()
    t.rescan_all()
    assert t.in_progress(5.0) == []

    t = tracker(tmp_path, clock)
    t.wall = time.time
    log_file = tmp_path / ".train.log"
    t.event(log_file, "opened")
    t.event(log_file, "closed")
    reader = tmp_path / "x.orbax-checkpoint-tmp-1"
    reader.mkdir()
    t.event(reader, "created")
    clock.advance(6)
    os.utime(reader, (old, old))
    t.event(reader / "a", "opened")  # a read: no write, does not make it recent
    t.event(reader / "a", "closed_no_write")
    assert t.in_progress(5.0) == []


def test_the_hf_trainers_temporary_folder_is_neither_a_checkpoint_nor_other_files(
    tmp_path: Path,
) -> None:
    """The HF Trainer writes ``tmp-checkpoint-<n>/`` and renames it to ``checkpoint-<n>``:
    its files were synced one by one as other files while being written; now it is a save
    under way that a drain waits for."""
    clock = Clock()
    t = tracker(tmp_path, clock, layout="hf-trainer")
    f = tmp_path / "tmp-checkpoint-500" / "model.safetensors"
    f.parent.mkdir()
    f.write_bytes(b"half")
    assert t.key_of(f) is None
    t.event(f, "created")
    t.event(f, "opened")
    assert t.tick() == [] and t.in_progress(5.0) == ["tmp-checkpoint-500"]
