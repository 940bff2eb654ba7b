"""A shared token bucket: caps upload bytes per second across all workers."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

__all__ = ["LIFT_AT_MOST_SECONDS", "BandwidthLimiter"]

#: A lift without an end time (a flush, an early warning) ends by then even if the queue
#: never runs empty after it (it was empty already, or other files kept going).
LIFT_AT_MOST_SECONDS = 600.0


class BandwidthLimiter:
    """``consume(n)`` blocks until ``n`` bytes fit under the rate; rate 0 means unlimited.

    :meth:`lift` removes the cap at once, also for a ``consume`` already waiting: until a
    monotonic time (a drain: its deadline), or until :meth:`work_done` (a flush, an early
    warning: the work queued now goes uncapped; at most :data:`LIFT_AT_MOST_SECONDS`).
    Afterwards the cap holds again.
    ``clock`` and ``sleep`` are injectable. Thread-safe.
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
        self._lifted_until = float("-inf")  # a drain's lift
        self._done_by = float("-inf")  # a lift until work_done(), bounded
        self._uncapped_since = float("-inf")  # when the lift in force began

    def lift(self, until: float | None = None) -> None:
        """No cap until the monotonic time ``until``, or, with None, until :meth:`work_done`
        (at most :data:`LIFT_AT_MOST_SECONDS`)."""
        with self._lock:
            if self.limited:
                self._uncapped_since = self._clock()
            if until is None:
                self._done_by = self._clock() + LIFT_AT_MOST_SECONDS
            else:
                self._lifted_until = max(self._lifted_until, until)

    def work_done(self) -> None:
        """Nothing is left to upload: a lift without an end time is over."""
        with self._lock:
            self._done_by = float("-inf")

    def uncapped_for(self) -> float:
        """Seconds uploads have gone uncapped without a break: infinite without a cap, 0
        while it holds (a rate measured over a shorter span is in part the cap's)."""
        if self.rate == 0:
            return float("inf")
        return 0.0 if self.limited else self._clock() - self._uncapped_since

    @property
    def limited(self) -> bool:
        now = self._clock()
        return self.rate > 0 and now >= self._lifted_until and now >= self._done_by

    def consume(self, n: int) -> None:
        if not self.limited:
            return
        with self._lock:
            now = self._clock()
            start = max(self._next, now - 1.0)  # allow at most one second of burst
            self._next = start + n / self.rate
            wait = self._next - now
        while wait > 0 and self.limited:
            step = min(wait, 0.1)
            self._sleep(step)
            wait -= step
