"""InotifySource: watchdog's inotify emitter feeding the watcher's queue directly."""

from __future__ import annotations

import os
import queue
from pathlib import Path

from watchdog.events import (
    DirModifiedEvent,
    FileClosedNoWriteEvent,
    FileCreatedEvent,
    FileSystemEvent,
)

from sidecar.watch.inotify import InotifySource
from sidecar.watch.watcher import EVENTS


def test_equal_events_back_to_back_both_reach_the_queue_and_made_up_ones_do_not(
    tmp_path: Path,
) -> None:
    # watchdog's observer queue drops an event equal to the one before it; two handles on
    # one file closed in a row are two equal events and the tracker counts both
    sink: queue.SimpleQueue[FileSystemEvent] = queue.SimpleQueue()
    source = InotifySource(tmp_path, sink, EVENTS)
    source.start()
    try:
        emitter = source._emitter
        assert emitter is not None
        path = str(tmp_path / "model_1.pt")
        emitter.queue_event(FileClosedNoWriteEvent(path))
        emitter.queue_event(FileClosedNoWriteEvent(path))
        emitter.queue_event(DirModifiedEvent(str(tmp_path)))  # not asked for
        emitter.queue_event(FileCreatedEvent(path, is_synthetic=True))  # made up by watchdog
    finally:
        source.stop()
    got = []
    while not sink.empty():
        got.append(sink.get())
    assert got == [FileClosedNoWriteEvent(path), FileClosedNoWriteEvent(path)]


def test_events_arrive_in_order_and_stop_ends_the_threads(tmp_path: Path) -> None:
    sink: queue.SimpleQueue[FileSystemEvent] = queue.SimpleQueue()
    source = InotifySource(tmp_path, sink, EVENTS)
    source.start()
    threads = [source._emitter, source._fd]
    with open(tmp_path / "a.bin", "wb") as f:
        f.write(b"a")
    os.rename(tmp_path / "a.bin", tmp_path / "b.bin")
    kinds: list[tuple[str, str, str]] = []
    while len(kinds) < 4:
        ev = sink.get(timeout=10)
        dest = os.path.basename(str(ev.dest_path)) if ev.dest_path else ""
        kinds.append((ev.event_type, os.path.basename(str(ev.src_path)), dest))
    assert kinds == [
        ("created", "a.bin", ""),
        ("opened", "a.bin", ""),
        ("closed", "a.bin", ""),
        ("moved", "a.bin", "b.bin"),
    ]
    source.stop()
    assert all(t is not None and not t.is_alive() for t in threads)


def test_start_on_a_missing_folder_raises_and_leaves_nothing_running(tmp_path: Path) -> None:
    sink: queue.SimpleQueue[FileSystemEvent] = queue.SimpleQueue()
    source = InotifySource(tmp_path / "missing", sink, EVENTS)
    try:
        source.start()
    except OSError:
        pass
    else:
        source.stop()
        raise AssertionError("start() on a missing folder did not raise")
    assert source._emitter is None and source._fd is None
