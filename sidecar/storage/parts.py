"""One file's parts sent in parallel within a backend's :class:`Budget`: the loop that S3
multipart uploads and copies, GCS XML multipart uploads and Azure staged blocks share.

Contract of :func:`send_parts`:

* a part is produced only once it holds a budget slot: ``next_part()`` runs on ``reader``
  (the backend's one reading thread, so the C allocator hands freed part buffers out again
  instead of growing an arena per uploading thread; ``None``: in the calling thread) and
  returns the part, or ``None`` when there is none left;
* ``send(part)`` runs on ``pool``; the part's slot comes back when that call is done, has
  failed or was cancelled, or at once when ``next_part`` returned ``None`` or raised;
* ``on_sent(result)`` runs in the calling thread for every part sent, in the order the
  parts finish, while later parts are still being read and sent (progress, ETags);
* whatever ``next_part``, ``send`` or ``on_sent`` raises (``Cancelled``, a
  ``StorageError``, ``OSError`` from reading) stops producing, cancels this call's parts
  not yet started, waits for its parts already running, and is re-raised, so the caller
  can abort its upload. Other callers' parts on ``pool`` are neither cancelled nor waited
  for.

The calling thread keeps no reference to a part once it is handed to ``pool``, so about
the budget's slots of parts, of all callers together, are in memory (a part's buffer is
freed when its pool thread lets go of it, just after its slot came back).
"""

from __future__ import annotations

import concurrent.futures as cf
from collections.abc import Callable, Iterable
from typing import TypeVar

from sidecar.storage.budget import Budget, raise_failed

__all__ = ["send_parts"]

P = TypeVar("P")
R = TypeVar("R")


def send_parts(
    next_part: Callable[[], P | None],
    send: Callable[[P], R],
    on_sent: Callable[[R], None],
    *,
    budget: Budget,
    pool: cf.Executor,
    reader: cf.Executor | None = None,
) -> None:
    """Produce parts with ``next_part`` and send each with ``send`` until ``next_part``
    returns ``None``; return once every part was sent and given to ``on_sent``."""
    pending: set[cf.Future[R]] = set()

    def harvest(done: Iterable[cf.Future[R]]) -> None:
        for fut in done:
            pending.discard(fut)
            on_sent(fut.result())  # a failed part raises its error here

    try:
        while True:
            budget.acquire(lambda: raise_failed(pending))
            try:
                harvest([fut for fut in pending if fut.done()])
                part = reader.submit(next_part).result() if reader else next_part()
                if part is None:
                    budget.release()
                    break
                fut = budget.submit(pool, send, part)
            except BaseException:
                budget.release()
                raise
            pending.add(fut)
            del part  # its buffer goes when its send is done, not when the next slot comes
        while pending:
            done, _ = cf.wait(pending, return_when=cf.FIRST_COMPLETED)
            harvest(done)
    except BaseException:
        for fut in pending:
            fut.cancel()
        cf.wait(pending)
        raise
