"""When is an entry complete? The per-entry bookkeeping between raw events and hand-offs.

The tracker is told of file events (inotify) or asked to rescan everything (polling) and
returns :class:`CheckpointReady` values for entries that are complete by their layout rule:

* a file checkpoint: closed after writing or renamed into place (event mode), or stable;
* a folder: no file open for writing, nothing changed for ``settle_seconds``, no temporary
  names inside, and the layout's own rule (``.metadata``, ``latest``, marker ...) holds;
* other files: closed after writing, or stable, or else as a snapshot every
  ``other_interval_seconds``; an open handle does not hold them back (a log the trainer keeps
  open all day is synced as a snapshot);
* open handles (:class:`OpenHandles`, counted from inotify's open and close events, which the
  kernel may merge) hold an unchanged checkpoint back for ``open_hold_seconds`` at most
  (default: ten times ``settle_seconds``, at least 60 s); after that its counts are dropped
  (``watch.open_handles_dropped`` is logged) and it is judged as if closed;
* polling mode: every file's (size, mtime_ns, inode) unchanged across two scans at least
  ``settle_seconds`` apart, plus the layout's rule.

An entry is handed off again only when its snapshot differs from the last one handed off.
Hidden and temporary top-level names are ignored; other files are tracked one by one.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import structlog

from sidecar.model import CheckpointReady, EntryKind, FileEntry
from sidecar.watch.handles import OpenHandles
from sidecar.watch.layouts import Layout, is_temporary, name_problem, read_pointer, step_of
from sidecar.watch.saves import TemporarySaves
from sidecar.watch.scan import Snapshot, scan_entry

__all__ = ["CompletionTracker", "EventKind"]

log = structlog.get_logger("sidecar.watch")

RESTORE_ASIDE = ".replaced-"  # restore --force moves an entry aside to <name>.replaced-<time>
_MIN_RESCAN = 0.1  # seconds between two scans of one entry
UNREADABLE_RETRY_SECONDS = 5.0  # an entry with something unreadable is looked at this often
#: the least time counted open handles may hold an unchanged entry back (see the docstring)
MIN_OPEN_HOLD_SECONDS = 60.0
EventKind = str  # "created" | "closed" | "closed_no_write" | "opened" | "moved_in" | "deleted"


@dataclass
class _Entry:
    kind: EntryKind
    dirty: bool = True
    fast: bool = False  # closed-after-write or renamed into place since the last change
    snapshot: Snapshot | None = None
    since: float = 0.0
    emitted: Snapshot | None = None
    emitted_at: float = float("-inf")
    last_scan: float = float("-inf")
    is_dir: bool = False  # known from its first judgement on
    retry_at: float = 0.0  # something in it could not be read: look again then, not sooner
    held_open: bool = False  # at its last judgement a file of it was open for writing


def _readable(path: Path) -> bool:
    """As this process reads: by its effective ids (``os.access`` checks the real ones)."""
    return os.access(path, os.R_OK, effective_ids=os.access in os.supports_effective_ids)


class CompletionTracker:
    """Pure bookkeeping plus ``lstat`` scans; not thread-safe (the watcher loop owns it)."""

    def __init__(
        self,
        root: Path,
        layout: Layout,
        *,
        settle_seconds: float,
        step_regex: str | None = None,
        other_files: bool = True,
        other_interval_seconds: float = 60.0,
        poll_mode: bool = False,
        clock: Callable[[], float] = time.monotonic,
        wall: Callable[[], float] = time.time,
        on_symlink: Callable[[Path], None] | None = None,
        on_skip: Callable[[Path, str], None] | None = None,
        on_unreadable: Callable[[Path, str], None] | None = None,
        open_hold_seconds: float | None = None,
    ) -> None:
        self.root = root
        self.layout = layout
        self.settle = settle_seconds
        self.open_hold = (
            max(MIN_OPEN_HOLD_SECONDS, 10 * settle_seconds)
            if open_hold_seconds is None
            else open_hold_seconds
        )
        self.step_regex = step_regex
        self.other_files = other_files
        self.other_interval = other_interval_seconds
        self.poll_mode = poll_mode
        self.clock = clock
        self.wall = wall
        self.on_symlink = on_symlink
        self.on_skip = on_skip
        self.on_unreadable = on_unreadable
        self.entries: dict[str, _Entry] = {}
        self.handles = OpenHandles()
        self.saves = TemporarySaves(root)

    # -- classification ------------------------------------------------------------------
    def key_of(self, path: Path) -> tuple[str, EntryKind] | None:
        """The entry a path belongs to, or None when it is ignored."""
        try:
            rel = path.relative_to(self.root)
        except ValueError:
            return None
        parts = rel.parts
        if not parts:
            return None
        top = parts[0]
        if top.startswith(".") or is_temporary(top) or RESTORE_ASIDE in top:
            return None
        bad = next((name_problem(p) for p in parts if name_problem(p)), None)
        if bad is not None:
            self._skip(path, bad)
            return None
        top_path = self.root / top
        is_dir = top_path.is_dir() and not top_path.is_symlink()
        if len(parts) > 1:
            is_dir = True
        if self.layout.matches(top, is_dir):
            if "@" in top:  # the store's keys use "<name>@g<N>" for generations
                self._skip(self.root / top, "a checkpoint name may not contain '@'; rename it")
                return None
            return top, EntryKind.CHECKPOINT
        if any(p.startswith(".") or is_temporary(p) for p in parts):
            return None
        return "/".join(parts), EntryKind.OTHER

    def _entry(self, key: str, kind: EntryKind) -> _Entry:
        e = self.entries.get(key)
        if e is None or e.kind is not kind:
            e = self.entries[key] = _Entry(kind=kind)
        return e

    # -- inputs -----------------------------------------------------------------------------
    def event(self, path: Path, kind: EventKind, *, is_dir: bool = False) -> None:
        """Record one file-system event (event mode)."""
        if self.layout.pointer_file and path == self.root / self.layout.pointer_file:
            for e in self.entries.values():
                if e.kind is EntryKind.CHECKPOINT:
                    e.dirty = True
            self._pointer_target()
            return
        self.saves.event(path, kind, self.clock())
        # Handles are counted for every path, before classification: cheap (the daemon's own
        # reads make two such events per file), and a handle opened under a temporary name
        # still counts after the rename into place.
        if kind == "opened":
            self.handles.opened(path)
            return
        if kind in ("closed", "closed_no_write"):
            self.handles.closed(path)
            if kind == "closed_no_write":
                return
        found = self.key_of(path)
        if found is None:
            return
        key, ekind = found
        if ekind is EntryKind.OTHER and is_dir:
            self.rescan_other_dir(path)
            return
        e = self._entry(key, ekind)
        e.dirty = True
        e.retry_at = 0.0  # something changed: look now, not at the unreadable retry
        if kind in ("closed", "moved_in"):
            e.fast = True
        elif kind == "created":
            e.fast = False

    def moved(self, src: Path, dest: Path | None) -> None:
        """A rename: open handles follow the file (later writes and the close use ``dest``).
        ``dest`` None: moved out of the root, whose events no longer reach us, so its handles
        are forgotten (a new file at ``src`` does not inherit them)."""
        self.handles.moved(src, dest)

    def writers(self, key: str) -> int:
        """Open handles on files of the entry ``key`` (opened and not yet closed)."""
        return self.handles.count(self.root / key)

    def _open_other(self, key: str, e: _Entry) -> bool:
        """An other file still open (a log being appended to): writes make no event the
        watcher listens for, so only a look after the interval sees them."""
        return e.kind is EntryKind.OTHER and self.writers(key) > 0

    def _drop_handles(self, key: str, unchanged: float) -> None:
        """Forget the handles counted on ``key``'s files: it stood unchanged past the hold."""
        files = self.handles.forget(self.root / key)
        log.warning(
            "watch.open_handles_dropped",
            entry=key,
            files=files,
            unchanged_seconds=round(unchanged, 1),
            reason="its files looked open but nothing changed for this long; inotify merges "
            "equal events queued back to back, so a close may have gone unseen",
        )

    def _skip(self, path: Path, reason: str) -> None:
        if self.on_skip is not None:
            self.on_skip(path, reason)

    def _unreadable(self, path: Path, what: str) -> None:
        if self.on_unreadable is not None:
            self.on_unreadable(
                path,
                f"{what} is not readable by the sidecar's user (uid {os.getuid()}), so "
                "its entry is not uploaded until it is (looked at again every "
                f"{UNREADABLE_RETRY_SECONDS:.0f} s); give the trainer and the sidecar a shared "
                "group (Kubernetes fsGroup) or move it out of the watch folder",
            )

    def _pointer_target(self) -> None:
        assert self.layout.pointer_file
        target = read_pointer(self.root / self.layout.pointer_file)
        if target and "/" not in target and not target.startswith("."):
            self._entry(target, EntryKind.CHECKPOINT).dirty = True

    def rescan_other_dir(self, folder: Path) -> None:
        try:
            snap = scan_entry(folder, self.on_symlink) or {}
        except PermissionError as err:
            self._unreadable(Path(err.filename or folder), "this folder")
            return
        base = folder.relative_to(self.root).as_posix()
        for rel in snap:
            found = self.key_of(self.root / base / rel)
            if found:
                self._entry(*found).dirty = True

    def rescan_all(self) -> None:
        """Mark every entry in the root for a fresh look (start-up, polling, overflow)."""
        try:
            names = sorted(p.name for p in self.root.iterdir())
        except FileNotFoundError:
            names = []
        self.saves.rescan(names)
        present: set[str] = set()
        for name in names:
            path = self.root / name
            found = self.key_of(path)
            if found is None:
                continue
            key, kind = found
            if kind is EntryKind.OTHER and path.is_dir() and not path.is_symlink():
                if self.other_files:
                    self.rescan_other_dir(path)
                    present.update(k for k, e in self.entries.items() if k.startswith(key + "/"))
                continue
            self._entry(key, kind).dirty = True
            present.add(key)
        for key in [k for k in self.entries if k not in present]:
            self.entries[key].dirty = True  # a scan will find it gone and forget it

    # -- decisions --------------------------------------------------------------------------
    def in_progress(self, recent: float) -> list[str]:
        """Checkpoint entries being saved: seen but not scanned yet, or not handed off as they
        are now and changed within the last ``recent`` seconds (or, with a file of them open
        for writing, within the open hold); and saves under a temporary top-level name, to be
        renamed into place (an event or a modification time in the last ``recent`` seconds,
        or a handle open and an event within the open hold: :mod:`sidecar.watch.saves`).
        Names, sorted. An entry that
        never completes (a folder the layout does not take for whole) drops out ``recent``
        seconds after its last change.

        Callable from any thread: it judges a copy of the entries as they were a moment ago,
        so an entry may have completed or changed since."""
        now = self.clock()
        out = []
        for key, e in self.entries.copy().items():  # one C-level copy: no switch midway
            if e.kind is not EntryKind.CHECKPOINT or e.retry_at:  # retry_at: unreadable
                continue
            snap = e.snapshot
            if snap is None:
                out.append(key)
            elif snap != e.emitted:
                age = now - e.since
                if age < recent or (e.held_open and age < self.open_hold):
                    out.append(key)
        out += self.saves.active(now, self.wall(), recent, self.open_hold)
        return sorted(out)

    def next_deadline(self) -> float | None:
        """Monotonic time of the next needed look, or None when nothing is pending."""
        times = [self._deadline(k, e) for k, e in self.entries.items() if e.dirty]
        return min(times) if times else None

    def _deadline(self, key: str, e: _Entry) -> float:
        if e.retry_at:
            return e.retry_at
        if e.snapshot is None:
            return e.last_scan + _MIN_RESCAN if e.last_scan > float("-inf") else self.clock()
        if self.writers(key) > 0:
            look = e.last_scan + max(self.settle, _MIN_RESCAN)
            if e.kind is EntryKind.OTHER:  # open: its next snapshot is due after the interval
                return max(look, e.emitted_at + self.other_interval)
            return look
        if (e.fast and not e.is_dir) or not self.layout.needs_settle:  # fast: files only
            return e.last_scan + _MIN_RESCAN
        return max(e.since + self.settle, e.last_scan + _MIN_RESCAN)

    def tick(self) -> list[CheckpointReady]:
        now = self.clock()
        ready: list[CheckpointReady] = []
        for key in list(self.entries):
            e = self.entries[key]
            if not e.dirty or e.retry_at > now:
                continue
            if e.kind is EntryKind.OTHER and not self.other_files:
                del self.entries[key]
                continue
            e.last_scan = now
            try:
                snap = scan_entry(self.root / key, self.on_symlink)
            except PermissionError as err:  # e.g. a root-owned lost+found: skip, keep watching
                self._unreadable(Path(err.filename or self.root / key), "this folder")
                e.retry_at = now + UNREADABLE_RETRY_SECONDS
                continue
            e.retry_at = 0.0
            if snap is None or (e.kind is EntryKind.OTHER and not snap):
                del self.entries[key]
                continue
            if snap != e.snapshot:
                e.snapshot, e.since = snap, now
            item = self._decide(key, e, snap, now)
            if item is not None:
                ready.append(item)
        return ready

    def _decide(self, key: str, e: _Entry, snap: Snapshot, now: float) -> CheckpointReady | None:
        e.held_open = False
        if snap == e.emitted:  # handed off as it is now: nothing to judge again ...
            e.dirty = self._open_other(key, e)  # ... unless it is open: it may grow unseen
            return None
        stable = now - e.since >= self.settle
        if not snap:
            return None
        if e.kind is EntryKind.CHECKPOINT and self.writers(key) > 0:
            if now - e.since < self.open_hold:
                e.held_open = True
                return None
            self._drop_handles(key, now - e.since)
        is_dir = e.is_dir = (self.root / key).is_dir()
        bad = next(
            (
                (rel, name_problem(part))
                for rel in snap
                for part in rel.split("/")
                if name_problem(part)
            ),
            None,
        )
        if bad is not None:
            self._skip(self.root / key / bad[0], f"{bad[1]}; the checkpoint waits for it")
            return None
        if e.kind is EntryKind.CHECKPOINT:
            if not self.layout.complete(key, is_dir, snap, self.root):
                if stable:
                    e.dirty = self.poll_mode
                return None
            quick = not self.poll_mode and (
                (not is_dir and e.fast) or (is_dir and not self.layout.needs_settle)
            )
            if not (quick or stable):
                return None
        else:
            overdue = now - e.emitted_at >= self.other_interval
            if not ((not self.poll_mode and e.fast) or stable or overdue):
                return None
        base = self.root / key  # ready to hand off: only now is every file's mode asked
        locked = next((r for r in snap if not _readable(base / r if is_dir else base)), None)
        if locked is not None:  # uploading it could only fail; look again in a while
            self._unreadable(base / locked if is_dir else base, "this file")
            e.retry_at = now + UNREADABLE_RETRY_SECONDS
            return None
        e.dirty = self._open_other(key, e)
        e.emitted, e.emitted_at, e.fast = snap, now, False
        return self._ready(key, e.kind, is_dir, snap, now)

    def _ready(
        self, key: str, kind: EntryKind, is_dir: bool, snap: Snapshot, now: float
    ) -> CheckpointReady:
        base = self.root / key
        files = tuple(
            FileEntry(rel=rel, path=base / rel if is_dir else base, state=st)
            for rel, st in sorted(snap.items())
            if not is_temporary(rel.rsplit("/", 1)[-1])
        )
        return CheckpointReady(
            name=key,
            kind=kind,
            is_dir=is_dir,
            files=files,
            step=step_of(key, self.step_regex) if kind is EntryKind.CHECKPOINT else None,
            completed_at=self.wall(),
            completed_mono=now,
            layout=self.layout.name,
        )

    def forget_emitted(self, key: str) -> None:
        """Let an entry be handed off again on its next look (after a failed upload)."""
        e = self.entries.get(key)
        if e is None:
            found = self.key_of(self.root / key)
            if found is None:
                return
            e = self._entry(*found)
        e.emitted = None
        e.dirty = True
