"""Saves written under a temporary top-level name, which the writer renames into place when
whole (``atomic_save``'s ``.<name>.<random>.tmp``, Orbax's ``<step>.orbax-checkpoint-tmp-<n>``,
the HF Trainer's ``tmp-checkpoint-<n>``): not checkpoint entries, but a save under way that
a drain waits for.

Contract of :class:`TemporarySaves`: fed every watcher event (:meth:`~TemporarySaves.event`)
and the root's names at every full look (:meth:`~TemporarySaves.rescan`) by the watcher's
thread; :meth:`~TemporarySaves.active` may be called from any thread (it judges a copy). A
save counts while an event of it (not a read) or its modification time is recent, or a
handle opened on it is not closed yet, for at most ``hold`` seconds after its last event.
Editor files (``*.swp``, ``*~``) and the daemon's own (``*ckpt-sidecar*``) are not saves.
"""

from __future__ import annotations

import fnmatch
import os
import re
from pathlib import Path

from sidecar.watch.layouts import SAVE_TEMP_GLOBS

__all__ = ["TemporarySaves", "is_save_temp"]

# and atomic_save's ``.<name>.<random>.tmp.<ext>`` when a path writer adds an extension
_SAVE_TEMP = re.compile("|".join(fnmatch.translate(g) for g in (*SAVE_TEMP_GLOBS, ".*.tmp.*")))


def is_save_temp(name: str) -> bool:
    """Whether a top-level ``name`` is one a save is written under before its rename."""
    return "ckpt-sidecar" not in name and _SAVE_TEMP.match(name) is not None


def _written(path: Path, wall: float, within: float) -> bool:
    """Whether ``path`` (a file, or a folder: a name added or removed in it) was modified in
    the last ``within`` seconds (a write makes no event the watcher listens for)."""
    try:
        return wall - os.stat(path, follow_symlinks=False).st_mtime < within
    except OSError:
        return False


class TemporarySaves:
    """The saves under temporary names in ``root`` (see the module docstring)."""

    def __init__(self, root: Path) -> None:
        self.root = root
        #: top-level name: (handles opened - closed, monotonic time of its last event)
        self._saves: dict[str, tuple[int, float]] = {}

    def event(self, path: Path, kind: str, now: float) -> None:
        """One watcher event (``opened``, ``closed``, ``closed_no_write``, ``created``,
        ``moved_in``, ``deleted``) on ``path`` at monotonic time ``now``."""
        try:
            parts = path.relative_to(self.root).parts
        except ValueError:
            return
        if not parts or not is_save_temp(parts[0]):
            return
        top = parts[0]
        if kind == "deleted" and len(parts) == 1:  # renamed into place, or removed
            self._saves.pop(top, None)
            return
        handles, last = self._saves.get(top, (0, float("-inf")))
        if kind == "opened":
            handles += 1
        elif kind in ("closed", "closed_no_write"):
            handles = max(handles - 1, 0)
        if kind not in ("opened", "closed_no_write"):  # written, created, moved, removed
            last = now
        self._saves[top] = (handles, last)

    def rescan(self, names: list[str]) -> None:
        """The root holds ``names`` now (start-up, polling, overflow): saves found are judged
        by their modification time, gone ones forgotten."""
        found = {n for n in names if is_save_temp(n)}
        for top in [t for t in self._saves if t not in found]:
            del self._saves[top]
        for top in found:
            self._saves.setdefault(top, (0, float("-inf")))

    def active(self, now: float, wall: float, recent: float, hold: float) -> list[str]:
        """Top-level names of saves under way at monotonic ``now`` / wall-clock ``wall``."""
        out = []
        for top, (handles, last) in self._saves.copy().items():  # one C-level copy
            age = now - last
            if age < recent or (handles and age < hold) or _written(self.root / top, wall, recent):
                out.append(top)
        return out
