"""The watcher thread: file events (inotify via watchdog) or periodic scans, into the tracker.

Producer and consumer apart: the inotify source's threads only enqueue events; this
thread owns the :class:`CompletionTracker` and calls ``on_ready`` for each hand-off.
"""

from __future__ import annotations

import contextlib
import os
import queue
import threading
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

import structlog
from watchdog.events import (
    DirCreatedEvent,
    DirDeletedEvent,
    DirMovedEvent,
    EventsLostEvent,
    FileClosedEvent,
    FileClosedNoWriteEvent,
    FileCreatedEvent,
    FileDeletedEvent,
    FileMovedEvent,
    FileOpenedEvent,
    FileSystemEvent,
)

from sidecar.model import CheckpointReady
from sidecar.watch.completion import CompletionTracker

if TYPE_CHECKING:
    from sidecar.watch.inotify import InotifySource

__all__ = ["NETWORK_FS", "Watcher", "choose_mode"]

log = structlog.get_logger("sidecar.watch")

NETWORK_FS = {"nfs", "nfs4", "cifs", "smb3", "smbfs", "lustre", "ceph", "9p", "glusterfs", "gpfs"}
_IDLE_CHECK = 5.0  # seconds between checks that the root still exists while idle
#: after the first event of a quiet spell, events are let gather this long before they are
#: read: the daemon's own reads make two events per file, and taken one by one they cost
#: several times the CPU (bench/commit_latency.md, 10,000 files)
BATCH_SECONDS = 0.02
#: A checkpoint entry not complete yet counts as being saved (a drain waits for it) while it
#: changed in the last this many seconds: longer than a writer's pause between two files of
#: one save, short enough that a folder that never completes holds a drain only briefly.
SAVING_SECONDS = 5.0
#: In polling mode a drain asks for a look this often (:meth:`Watcher.rescan`): a poll
#: interval of a minute on a network file system would not see a save begun meanwhile.
DRAIN_LOOK_SECONDS = 1.0
#: the events the tracker needs. Not "modified" (IN_MODIFY, one per write() call: a trainer
#: writing in 64 KiB pieces cost the daemon 0.48 CPU-s per GiB in event handling alone,
#: bench/watch_events.md) nor "attrib": a file being written is held open (counted from its
#: open and close events) and a tick re-reads the sizes of an entry that is not yet
#: handed off, so neither adds a decision, only wake-ups.
EVENTS: list[type[FileSystemEvent]] = [
    FileCreatedEvent,
    DirCreatedEvent,
    FileDeletedEvent,
    DirDeletedEvent,
    FileMovedEvent,
    DirMovedEvent,
    FileOpenedEvent,
    FileClosedEvent,
    FileClosedNoWriteEvent,
    EventsLostEvent,  # the kernel's queue overflowed: events were lost, look at everything
]


def _fs_type(path: Path) -> str | None:
    """The mount type of the file system holding ``path``, from /proc/mounts."""
    try:
        lines = Path("/proc/mounts").read_text().splitlines()
    except OSError:
        return None
    target = str(path.resolve())
    best, best_len = None, -1
    for line in lines:
        parts = line.split()
        if len(parts) < 3:
            continue
        mnt = parts[1].replace("\\040", " ")
        if (target == mnt or target.startswith(mnt.rstrip("/") + "/")) and len(mnt) > best_len:
            best, best_len = parts[2], len(mnt)
    return best


def choose_mode(mode: str, path: Path) -> str:
    """Resolve ``auto``: poll on network and FUSE file systems (inotify sees nothing there)."""
    if mode != "auto":
        return mode
    fs = _fs_type(path) or ""
    if fs in NETWORK_FS or fs.startswith("fuse"):
        return "poll"
    try:
        import sidecar.watch.inotify  # noqa: F401  (what inotify mode runs on)
    except (ImportError, OSError):
        return "poll"
    return "inotify"


class Watcher:
    """Runs the tracker on its own thread; ``on_ready`` gets each complete entry."""

    def __init__(
        self,
        tracker: CompletionTracker,
        on_ready: Callable[[CheckpointReady], None],
        *,
        mode: str,
        poll_interval: float,
    ) -> None:
        self.tracker = tracker
        self.on_ready = on_ready
        self.mode = mode
        self.poll_interval = poll_interval
        self._events: queue.SimpleQueue[FileSystemEvent] = queue.SimpleQueue()
        self._stop = threading.Event()
        self._source: InotifySource | None = None
        self._thread = threading.Thread(target=self._run, name="watcher", daemon=True)
        self._requeue: queue.SimpleQueue[str] = queue.SimpleQueue()
        self.alive = False
        self._root_id: tuple[int, int] | None = None

    @property
    def root(self) -> Path:
        return self.tracker.root

    def start(self) -> None:
        if self.mode == "inotify":
            self._start_source()
        self.alive = True  # before the thread runs, so /healthz never sees a gap at start
        self._thread.start()

    def _start_source(self) -> None:
        from sidecar.watch.inotify import InotifySource  # Linux only: imported when used

        self._root_id = self._identity()
        # Its moves are full events: a file renamed in from outside the root is a move
        # (complete, like a rename inside it), not a creation that must wait out settle_seconds.
        source = InotifySource(self.root, self._events, EVENTS)
        source.start()
        self._source = source

    def _stop_source(self) -> None:
        source, self._source = self._source, None
        if source is not None:
            source.stop()

    def _identity(self) -> tuple[int, int] | None:
        """(device, inode) of the root: a folder replaced in place gets a new one."""
        try:
            st = os.stat(self.root)
        except OSError:
            return None
        return (st.st_dev, st.st_ino)

    def stop(self) -> None:
        self._stop.set()
        self._events.put(FileSystemEvent(""))  # wake the loop
        self._stop_source()
        if self._thread.is_alive():
            self._thread.join(timeout=5)

    def rescan(self) -> None:
        """Ask for a fresh look at the whole root (thread-safe)."""
        self._requeue.put("")
        self._events.put(FileSystemEvent(""))

    def in_progress(self) -> list[str]:
        """Checkpoint entries being saved now (:meth:`CompletionTracker.in_progress`: changed
        in the last :data:`SAVING_SECONDS`, or settle time if longer, plus the drain's look
        interval in polling mode, when a change is seen that much later); empty when the
        watcher does not run. Thread-safe."""
        if not self.alive:
            return []
        recent = max(self.tracker.settle, SAVING_SECONDS)
        if self.mode == "poll":  # a change is seen at the next look: during a drain, soon
            recent += min(self.poll_interval, DRAIN_LOOK_SECONDS)
        return self.tracker.in_progress(recent)

    def retry_later(self, key: str) -> None:
        """Ask for ``key`` to be handed off again once it is stable (thread-safe)."""
        self._requeue.put(key)
        self._events.put(FileSystemEvent(""))

    def _run(self) -> None:
        try:
            self.tracker.rescan_all()
            while not self._stop.is_set():
                self._step()
        except Exception:
            log.exception("watch.crashed")
            raise
        finally:
            self.alive = False

    def _emit(self) -> None:
        for item in self.tracker.tick():
            self.on_ready(item)

    def _step(self) -> None:
        while not self._requeue.empty():
            key = self._requeue.get()
            if key:
                self.tracker.forget_emitted(key)
            elif self.mode != "poll":  # polling looks at everything just below anyway
                self.tracker.rescan_all()
        if self.mode == "poll":
            self.tracker.rescan_all()
            self._emit()
            with contextlib.suppress(queue.Empty):
                self._events.get(timeout=self.poll_interval)
            return
        deadline = self.tracker.next_deadline()
        now = self.tracker.clock()
        timeout = _IDLE_CHECK if deadline is None else max(0.0, deadline - now)
        try:
            ev = self._events.get(timeout=timeout)
            self._feed(ev)
            self._stop.wait(BATCH_SECONDS)
            while True:
                self._feed(self._events.get_nowait())
        except queue.Empty:
            pass
        if not self.root.is_dir():
            self._root_lost()
            return
        if self.mode == "inotify" and self._identity() != self._root_id:
            log.warning("watch.root_replaced", path=str(self.root))
            self._restart_source()
            return
        deadline = self.tracker.next_deadline()
        if deadline is not None and deadline <= self.tracker.clock():
            self._emit()

    def _feed(self, ev: FileSystemEvent) -> None:
        kind = ev.event_type
        if isinstance(ev, EventsLostEvent):
            # Counted open handles stay as they are: too many only delay (for at most the
            # tracker's open hold), too few could hand off a file still being written.
            log.warning("watch.events_lost", path=str(self.root), action="rescanning the folder")
            self.tracker.rescan_all()
            return
        if kind == "moved":  # either side is "" when it is outside the root
            src = Path(str(ev.src_path)) if ev.src_path else None
            dest = Path(str(ev.dest_path)) if ev.dest_path else None
            if src is not None:
                self.tracker.moved(src, dest)
                self.tracker.event(src, "deleted", is_dir=ev.is_directory)
            if dest is not None:
                self.tracker.event(dest, "moved_in", is_dir=ev.is_directory)
            return
        if not ev.src_path:
            return
        self.tracker.event(Path(str(ev.src_path)), kind, is_dir=ev.is_directory)

    def _restart_source(self) -> None:
        self._stop_source()
        self._start_source()
        self.tracker.rescan_all()

    def _root_lost(self) -> None:
        log.warning("watch.root_missing", path=str(self.root))
        self._stop_source()
        while not self._stop.wait(1.0):
            if self.root.is_dir():
                log.info("watch.root_back", path=str(self.root))
                if self.mode == "inotify":
                    self._start_source()
                self.tracker.rescan_all()
                return
