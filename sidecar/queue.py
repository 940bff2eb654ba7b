"""The bounded checkpoint queue: newest first, superseding the oldest not-started entry.

Two lanes: checkpoints (ordered by step, then completion time, newest first) and other
files (FIFO, lower priority). Bounds: ``max_checkpoints`` entries and ``max_bytes`` bytes
in the checkpoint lane; when over, the oldest *not started* checkpoint is superseded and
returned to the caller to log and count. The newest checkpoint is never superseded.
An entry put again under the same name replaces its older snapshot.
"""

from __future__ import annotations

import threading

from sidecar.model import CheckpointReady, EntryKind

__all__ = ["CheckpointQueue"]


class CheckpointQueue:
    """Thread-safe; ``get`` blocks until an item, ``close`` or the timeout."""

    def __init__(self, max_checkpoints: int, max_bytes: int) -> None:
        self.max_checkpoints = max_checkpoints
        self.max_bytes = max_bytes
        self._ckpts: dict[str, CheckpointReady] = {}
        self._others: dict[str, CheckpointReady] = {}
        self._cond = threading.Condition()
        self._closed = False

    def put(self, item: CheckpointReady) -> list[CheckpointReady]:
        """Enqueue; returns the checkpoints this superseded (never ``item`` if it is newest)."""
        superseded: list[CheckpointReady] = []
        with self._cond:
            if item.kind is EntryKind.OTHER:
                self._others.pop(item.name, None)
                self._others[item.name] = item
            else:
                old = self._ckpts.pop(item.name, None)
                if old is not None:
                    superseded.append(old)
                self._ckpts[item.name] = item
                superseded += self._enforce_bounds()
            self._cond.notify_all()
        return superseded

    def _enforce_bounds(self) -> list[CheckpointReady]:
        dropped = []
        while len(self._ckpts) > 1 and (
            len(self._ckpts) > self.max_checkpoints or self._bytes() > self.max_bytes
        ):
            oldest = min(self._ckpts.values(), key=CheckpointReady.order)
            dropped.append(self._ckpts.pop(oldest.name))
        return dropped

    def _bytes(self) -> int:
        return sum(i.size for i in self._ckpts.values())

    def get_checkpoint(self, timeout: float | None = None) -> CheckpointReady | None:
        """The newest pending checkpoint, removed from the queue; None on timeout or close."""
        with self._cond:
            if not self._ckpts and not self._closed:
                self._cond.wait(timeout)
            if not self._ckpts:
                return None
            newest = max(self._ckpts.values(), key=CheckpointReady.order)
            return self._ckpts.pop(newest.name)

    def get_other(self, timeout: float | None = None) -> CheckpointReady | None:
        """The oldest pending other file; None on timeout or close."""
        with self._cond:
            if not self._others and not self._closed:
                self._cond.wait(timeout)
            if not self._others:
                return None
            name = next(iter(self._others))
            return self._others.pop(name)

    def supersede_all_but_newest(self) -> list[CheckpointReady]:
        """Drain: drop every pending checkpoint but the newest; return the dropped ones."""
        with self._cond:
            if len(self._ckpts) <= 1:
                return []
            newest = max(self._ckpts.values(), key=CheckpointReady.order)
            dropped = [i for i in self._ckpts.values() if i is not newest]
            self._ckpts = {newest.name: newest}
            return dropped

    def newest(self) -> CheckpointReady | None:
        with self._cond:
            return max(self._ckpts.values(), key=CheckpointReady.order) if self._ckpts else None

    def depth(self) -> tuple[int, int, int]:
        """(pending checkpoints, their bytes, pending other files)."""
        with self._cond:
            return len(self._ckpts), self._bytes(), len(self._others)

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify_all()
