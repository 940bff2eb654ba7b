"""Server-side copy inside one account: Copy Blob from the source URL, polled to the end.

Within one account the service usually finishes a block-blob copy before it answers
(``copy_status`` ``success``); a large one may answer ``pending`` and go on in the
background. :func:`wait_for_copy` polls until the service reports the end, aborting the
copy (so no partial blob stays) when it takes longer than the timeout.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from sidecar.storage.base import TransientError

__all__ = ["wait_for_copy"]


def wait_for_copy(
    status: str | None,
    poll: Callable[[], str | None],
    abort: Callable[[], None],
    *,
    what: str,
    timeout: float,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
) -> None:
    """Return once ``status`` (then each ``poll()``) is ``"success"``.

    Raises :class:`TransientError` when the copy failed or was aborted on the service, or
    after ``abort()`` when it is still pending after ``timeout`` seconds.
    """
    deadline = clock() + timeout
    delay = 0.05
    while status == "pending":
        if clock() >= deadline:
            abort()
            raise TransientError(f"{what}: still pending after {timeout:.0f} s; aborted")
        sleep(delay)  # the service has no completion event; poll with backoff
        delay = min(delay * 2, 2.0)
        status = poll()
    if status != "success":
        raise TransientError(f"{what}: the service reports the copy {status!r}")
