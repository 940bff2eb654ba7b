"""What is complete locally but not yet durable: the drain's outcome, and the
``unprotected_seconds`` gauge (the age of the newest such checkpoint: each new one resets
it, so it is a lower bound of what a reclaim now would lose).

An entry leaves the set when it, or a checkpoint that outranks it, is committed, or when it
vanishes.
A newer snapshot of the same name (written again during an upload) stays until its own
commit. Thread-safe.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

from sidecar.model import CheckpointReady

__all__ = ["Unprotected"]


class Unprotected:
    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._items: dict[str, CheckpointReady] = {}
        self._lock = threading.Lock()
        self._clock = clock

    def add(self, item: CheckpointReady) -> None:
        with self._lock:
            self._items[item.name] = item

    def committed(self, item: CheckpointReady) -> None:
        """``item`` is durable: drop it (not a newer snapshot of its name) and every entry of
        another name it outranks whose files were written no later than its own: older
        content, however late it was handed off (an upload retried after a failure is handed
        off again, and a drain that superseded it for ``item`` must not count it missing).
        Content written later (Lightning's ``last.ckpt`` saved again, a new run's lower
        step) stays until its own commit or its coverage (:mod:`sidecar.coverage`)."""
        written = item.written_ns
        with self._lock:
            for name in [
                n
                for n, p in self._items.items()
                if (n == item.name and p.completed_mono <= item.completed_mono)
                or (n != item.name and p.order() < item.order() and p.written_ns <= written)
            ]:
                del self._items[name]

    def vanished(self, item: CheckpointReady) -> None:
        """``item`` is gone from the watch folder: drop it, not a newer snapshot of its name
        handed off meanwhile."""
        with self._lock:
            p = self._items.get(item.name)
            if p is not None and p.completed_mono <= item.completed_mono:
                del self._items[item.name]

    def names(self) -> list[str]:
        with self._lock:
            return sorted(self._items)

    def seconds(self) -> float:
        """Age of the newest complete checkpoint not yet durable; 0 when there is none."""
        with self._lock:
            items = list(self._items.values())
        if not items:
            return 0.0
        return max(0.0, self._clock() - max(items, key=CheckpointReady.order).completed_mono)
