"""Open handles per path, counted from inotify's open and close events.

The count is a hint, not a fact: the kernel merges two equal events queued back to back, so
two closes of one file in a row can arrive as one and a count stay above zero after the
last handle closed (and two opens as one, leaving it too low). The completion tracker
bounds what a stale count can do (``CompletionTracker.open_hold``).
"""

from __future__ import annotations

from pathlib import Path

__all__ = ["OpenHandles"]


class OpenHandles:
    """Counts by path; a count never goes below zero. Not thread-safe."""

    def __init__(self) -> None:
        self._open: dict[Path, int] = {}

    def opened(self, path: Path) -> None:
        self._open[path] = self._open.get(path, 0) + 1

    def closed(self, path: Path) -> None:
        left = self._open.get(path, 0) - 1
        if left > 0:
            self._open[path] = left
        else:
            self._open.pop(path, None)

    def _under(self, base: Path) -> list[Path]:
        return [p for p in self._open if p == base or base in p.parents]

    def moved(self, src: Path, dest: Path | None) -> None:
        """Handles on ``src`` (a file, or everything under a folder) follow it to ``dest``;
        ``dest`` None (moved out of sight) forgets them."""
        for path in self._under(src):
            count = self._open.pop(path)
            if dest is not None:
                new = dest / path.relative_to(src) if path != src else dest
                self._open[new] = self._open.get(new, 0) + count

    def count(self, base: Path) -> int:
        """Handles open on ``base`` or anything under it."""
        return sum(self._open[p] for p in self._under(base))

    def forget(self, base: Path) -> int:
        """Drop the counts of ``base`` and everything under it; how many paths had one."""
        paths = self._under(base)
        for p in paths:
            del self._open[p]
        return len(paths)
