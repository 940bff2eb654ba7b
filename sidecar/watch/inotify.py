"""Inotify events of a folder tree, every one, in order, straight into the watcher's queue.

watchdog's observer hands events to handlers through a queue that drops an event equal to
the one put just before it (``watchdog.utils.bricks.SkipRepeatsQueue``), on one more thread.
Two handles on one file closed one right after the other are two equal events, and the
completion tracker counts handles: with one dropped, the file looks open for ever and its
checkpoint never completes. :class:`InotifySource` runs watchdog's own inotify emitter (with
full move events) and its own reader, and puts each event of the given types into the
caller's queue as it is; nothing is merged or dropped.

Except watchdog's synthetic events (``is_synthetic``), which the kernel never sent: one per
file and folder inside a folder moved or created in the tree, moved out or deleted. The
completion tracker looks at such a folder whole on its own event (a checkpoint folder is
scanned whole, another folder is listed), and moves open handles with it, so they would only
repeat that, 10,000 times for a folder of 10,000 files.
"""

from __future__ import annotations

import contextlib
import queue
from pathlib import Path

from watchdog.events import FileSystemEvent
from watchdog.observers.api import EventQueue, ObservedWatch
from watchdog.observers.inotify import InotifyFullEmitter
from watchdog.observers.inotify_c import InotifyFD

__all__ = ["InotifySource"]

_JOIN_SECONDS = 5.0


class _Emitter(InotifyFullEmitter):
    """watchdog's emitter, its events put into ``sink`` one by one."""

    def __init__(
        self,
        sink: queue.SimpleQueue[FileSystemEvent],
        watch: ObservedWatch,
        events: list[type[FileSystemEvent]],
        inotify_fd: InotifyFD,
    ) -> None:
        # The emitter's own queue is never used: queue_event below replaces the one put.
        super().__init__(EventQueue(), watch, event_filter=events, inotify_fd=inotify_fd)
        self._sink = sink
        self._wanted = frozenset(events)

    def queue_event(self, event: FileSystemEvent) -> None:
        if type(event) in self._wanted and not event.is_synthetic:
            self._sink.put(event)


class InotifySource:
    """Watches ``root`` recursively (symlinks not followed) while started.

    Guarantees: each inotify event of a type in ``events`` reaches ``sink`` once, in the
    order the kernel gave it; events watchdog makes up for a folder's contents do not.
    ``start`` raises ``OSError`` when inotify cannot be set up (the per-user instance or
    watch limits); ``stop`` may be called any time.
    """

    def __init__(
        self,
        root: Path,
        sink: queue.SimpleQueue[FileSystemEvent],
        events: list[type[FileSystemEvent]],
    ) -> None:
        self.root = root
        self._sink = sink
        self._events = events
        self._fd: InotifyFD | None = None
        self._emitter: _Emitter | None = None

    def start(self) -> None:
        fd = InotifyFD()
        fd.start()
        self._fd = fd
        watch = ObservedWatch(str(self.root), recursive=True, event_filter=self._events)
        emitter = _Emitter(self._sink, watch, self._events, fd)
        try:
            emitter.start()  # sets the watches here, in the caller: their errors raise here
        except BaseException:
            self.stop()
            raise
        self._emitter = emitter

    def stop(self) -> None:
        emitter, self._emitter = self._emitter, None
        fd, self._fd = self._fd, None
        if emitter is not None:
            emitter.stop()
            with contextlib.suppress(RuntimeError):
                emitter.join(timeout=_JOIN_SECONDS)
        if fd is not None:
            fd.stop()
            with contextlib.suppress(RuntimeError):
                fd.join(timeout=_JOIN_SECONDS)
