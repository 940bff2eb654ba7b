"""A backend-wide bound on upload buffers (S3 parts, Azure blocks, GCS XML parts) held in
memory at once.

Contract: a backend creates one :class:`Budget` of ``slots`` and shares it between every
upload it runs, whatever thread each runs on. An upload calls :meth:`Budget.acquire`
before it reads a part into memory and makes sure :meth:`Budget.release` is called exactly
once for that slot: when the part's request is done, has failed or was cancelled (a
done-callback on its future), or at once if no part was read (end of file, read error).
So at most ``slots`` parts of all uploads together are in memory, about
``slots * part_size`` bytes. Slots are handed out in no particular order between waiters.
``on_idle``, if given, runs each time the last taken slot comes back (no part of any upload
is in memory), outside the budget's lock.
"""

from __future__ import annotations

import concurrent.futures as cf
import threading
from collections.abc import Callable, Iterable
from typing import Any, TypeVar

__all__ = ["Budget", "raise_failed"]

T = TypeVar("T")


def raise_failed(futures: Iterable[cf.Future[Any]]) -> None:
    """Raise the error of a finished future that failed, if any: the usual ``check`` for
    :meth:`Budget.acquire`, so an upload waiting for a slot sees its own failure."""
    for f in futures:
        if f.done() and not f.cancelled() and f.exception() is not None:
            f.result()


class Budget:
    """A bound on part buffers held at once, shared by every upload of one backend.

    ``acquire(check)`` waits for a free slot, calling ``check`` before the first look and
    each time a slot is given back, so an upload sees a failure of its own (``check``
    raises it) while it waits. ``check`` runs with the budget's lock held: it must be quick
    and must not call back into the budget; whatever it raises leaves ``acquire`` with no
    slot taken.
    """

    def __init__(self, slots: int, on_idle: Callable[[], None] | None = None) -> None:
        if slots < 1:
            raise ValueError(f"a budget needs at least one slot, not {slots}")
        self._slots = slots
        self._free = slots
        self._on_idle = on_idle
        self._cond = threading.Condition()

    def acquire(self, check: Callable[[], None] = lambda: None) -> None:
        with self._cond:
            while True:
                check()
                if self._free > 0:
                    self._free -= 1
                    return
                self._cond.wait()

    def release(self) -> None:
        with self._cond:
            self._free += 1
            idle = self._free == self._slots
            self._cond.notify_all()
        if idle and self._on_idle is not None:
            self._on_idle()

    def submit(self, pool: cf.Executor, fn: Callable[..., T], *args: Any) -> cf.Future[T]:
        """Run ``fn(*args)`` on ``pool`` for a caller that holds a slot: the slot is given back
        when the future is done, has failed or was cancelled. If ``submit`` itself raises,
        the caller still holds the slot."""
        future = pool.submit(fn, *args)
        future.add_done_callback(lambda _: self.release())
        return future
