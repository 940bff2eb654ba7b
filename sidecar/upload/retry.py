"""Exponential backoff with full jitter, bounded, on an injected clock."""

from __future__ import annotations

import random
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

from sidecar.storage.base import ChecksumMismatch, TransientError

__all__ = ["Backoff", "retry"]

T = TypeVar("T")


@dataclass(frozen=True)
class Backoff:
    """Delays: ``uniform(0, min(max_delay, initial * 2**attempt))``; ``attempts`` tries in all."""

    attempts: int = 8
    initial: float = 0.5
    max_delay: float = 30.0

    def delay(self, attempt: int, rng: Callable[[], float] = random.random) -> float:
        return rng() * min(self.max_delay, self.initial * (2.0**attempt))


def retry(
    fn: Callable[[], T],
    backoff: Backoff,
    *,
    on_retry: Callable[[int, Exception, float], None] | None = None,
    wait: Callable[[float], bool] | None = None,
    retryable: tuple[type[Exception], ...] = (TransientError, ChecksumMismatch),
) -> T:
    """Call ``fn`` until it succeeds, a non-retryable error, or ``attempts`` run out.

    ``wait(seconds)`` sleeps and returns True to stop early (e.g. a stop event's ``wait``);
    then the last error is raised. The last error is raised when attempts run out.
    """
    sleeper = wait or threading.Event().wait
    attempt = 0
    while True:
        try:
            return fn()
        except retryable as e:
            attempt += 1
            if attempt >= backoff.attempts:
                raise
            delay = backoff.delay(attempt - 1)
            if on_retry:
                on_retry(attempt, e, delay)
            if sleeper(delay):
                raise
