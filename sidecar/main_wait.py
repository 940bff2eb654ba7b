"""The main thread's sleep until the daemon stops, with no timer.

Contract: :meth:`MainWait.wait` returns once ``done`` is set and :meth:`MainWait.wake` was
called after it (any thread); meanwhile signal handlers still run at once. The kernel
delivers a signal to any thread of the process, and Python runs the handler in the main
thread only when that thread next executes bytecode: a main thread blocked on a lock (an
``Event.wait()`` without timeout) could sleep through a SIGTERM for ever. So the main
thread sleeps in ``select`` on a pipe that both :meth:`wake` and the signal machinery
(:func:`signal.set_wakeup_fd`, after :meth:`install`) write to.
"""

from __future__ import annotations

import contextlib
import os
import select
import signal
import threading

__all__ = ["MainWait"]


class MainWait:
    def __init__(self) -> None:
        self._r, self._w = os.pipe()
        os.set_blocking(self._r, False)
        os.set_blocking(self._w, False)

    def install(self) -> None:
        """Make every signal wake :meth:`wait` (main thread only; replaces any other
        wake-up fd)."""
        signal.set_wakeup_fd(self._w, warn_on_full_buffer=False)

    def wake(self) -> None:
        """Make :meth:`wait` look at ``done`` again (thread-safe; never blocks)."""
        with contextlib.suppress(BlockingIOError):  # full pipe: a wake-up is pending anyway
            os.write(self._w, b"\0")

    def wait(self, done: threading.Event) -> None:
        """Sleep until ``done`` is set (and :meth:`wake` called after setting it)."""
        while not done.is_set():
            select.select([self._r], [], [])
            with contextlib.suppress(BlockingIOError):
                os.read(self._r, 4096)
