"""Waiting on tasks that run in parallel: every result, or the first failure.

Contract of :func:`all_results`: returns the results in the order of ``futures`` once every
one succeeded, waking the caller once, not once per task. When one fails, ``stop`` is set,
the tasks not yet started are cancelled, and once none is still running the failure that
ended the wait is raised: not the error a task raised because ``stop`` told it to give up.
The same happens, with the interruption raised, when the wait itself is interrupted.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from concurrent.futures import FIRST_EXCEPTION, Future, wait
from typing import TypeVar

__all__ = ["all_results"]

T = TypeVar("T")


def all_results(futures: Sequence[Future[T]], stop: threading.Event) -> list[T]:
    """See the module docstring."""
    try:
        done, _ = wait(futures, return_when=FIRST_EXCEPTION)
        failed = next((f for f in done if f.exception() is not None), None)
        if failed is not None:
            failed.result()  # raises it, before any task was told to stop
        return [f.result() for f in futures]
    except BaseException:
        stop.set()
        for f in futures:
            f.cancel()
        wait(futures)
        raise
