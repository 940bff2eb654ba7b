"""Measured upload throughput over a sliding window, for the drain's estimate."""

from __future__ import annotations

import collections
import threading
import time
from collections.abc import Callable

__all__ = ["ThroughputMeter"]


class ThroughputMeter:
    """``add(n)`` as bytes go out; ``rate()`` is bytes/s over the last ``window`` seconds.

    ``total`` counts every byte ever added (for "how much of this checkpoint is sent").
    """

    def __init__(self, window: float = 5.0, clock: Callable[[], float] = time.monotonic) -> None:
        self.window = window
        self._clock = clock
        self._events: collections.deque[tuple[float, int]] = collections.deque()
        self._lock = threading.Lock()
        self.total = 0

    def add(self, n: int) -> None:
        now = self._clock()
        with self._lock:
            self.total += n
            self._events.append((now, n))
            self._trim(now)

    def _trim(self, now: float) -> None:
        while self._events and self._events[0][0] < now - self.window:
            self._events.popleft()

    def rate(self) -> float:
        now = self._clock()
        with self._lock:
            self._trim(now)
            if not self._events:
                return 0.0
            span = max(now - self._events[0][0], 0.5)
            return sum(n for _, n in self._events) / span
