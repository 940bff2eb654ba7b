"""A shared token bucket: caps upload bytes per second across all workers."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

__all__ = ["BandwidthLimiter"]


class BandwidthLimiter:
    """``consume(n)`` blocks until ``n`` bytes fit under the rate; rate 0 means unlimited.

    ``lift()`` removes the cap at once (drain); ``clock`` and ``sleep`` are injectable.
    """

    def __init__(
        self,
        rate: int,
        *,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self.rate = rate
        self._clock = clock
        self._sleep = sleep
        self._lock = threading.Lock()
        self._next = clock()
        self._lifted = threading.Event()

    def lift(self) -> None:
        self._lifted.set()

    @property
    def limited(self) -> bool:
        return self.rate > 0 and not self._lifted.is_set()

    def consume(self, n: int) -> None:
        if not self.limited:
            return
        with self._lock:
            now = self._clock()
            start = max(self._next, now - 1.0)  # allow at most one second of burst
            self._next = start + n / self.rate
            wait = self._next - now
        while wait > 0 and not self._lifted.is_set():
            step = min(wait, 0.1)
            self._sleep(step)
            wait -= step
