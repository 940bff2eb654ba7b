"""The ``signal`` source: SIGTERM/SIGINT drain then exit, SIGUSR1 drains and keeps running.

Handlers only start a thread: the drain itself never runs inside a signal handler. A second
SIGTERM during a drain starts no second drain (one notice per signal per second) and never
an immediate exit: the first drain decides the exit status.
"""

from __future__ import annotations

import signal
import threading
import time
from collections.abc import Callable
from types import FrameType

from sidecar.model import Notice

__all__ = ["install"]

NoticeHandler = Callable[[Notice, bool], None]  # (notice, exit_after)


def _notice(signum: int, grace: float) -> Notice:
    now, mono = time.time(), time.monotonic()
    kind = {signal.SIGTERM: "terminate", signal.SIGINT: "interrupt"}.get(
        signal.Signals(signum), "usr1"
    )
    return Notice(
        "signal", kind, now + grace, now, mono + grace, event_id=f"signal-{signum}-{int(now)}"
    )


def install(handler: NoticeHandler, grace_seconds: float) -> None:
    """Install the handlers (main thread only)."""

    def on_signal(signum: int, frame: FrameType | None) -> None:
        exit_after = signum != signal.SIGUSR1
        threading.Thread(
            target=handler,
            args=(_notice(signum, grace_seconds), exit_after),
            name="signal-drain",
            daemon=True,
        ).start()

    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGUSR1):
        signal.signal(sig, on_signal)
