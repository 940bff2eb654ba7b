"""MainWait: the daemon's main thread sleeps with no timer, and a signal still gets handled at
once, also when the kernel delivers it to another thread (it may pick any thread that does not
block the signal; here the main thread blocks it, so another one must take it)."""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
BOUND = 15.0  # seconds: the answer comes at once, or never

SCRIPT = """
import signal, threading
from sidecar.main_wait import MainWait

done, waiter = threading.Event(), MainWait()

def stop():  # what the daemon's drain thread does at its end
    done.set()
    waiter.wake()

signal.signal(signal.SIGTERM, lambda n, f: threading.Thread(target=stop).start())
waiter.install()
threading.Thread(target=threading.Event().wait, daemon=True).start()  # takes the signal
signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})
print("ready", flush=True)
waiter.wait(done)  # with done.wait() instead, the script never ends (checked by hand)
print("stopped", flush=True)
"""


def test_a_signal_taken_by_another_thread_ends_the_wait() -> None:
    with subprocess.Popen(
        [sys.executable, "-c", SCRIPT], cwd=ROOT, stdout=subprocess.PIPE, text=True
    ) as p:
        assert p.stdout is not None
        assert p.stdout.readline() == "ready\n"
        p.send_signal(signal.SIGTERM)
        try:
            out, _ = p.communicate(timeout=BOUND)
        except subprocess.TimeoutExpired:
            p.kill()
            raise AssertionError("the main thread slept through SIGTERM") from None
    assert p.returncode == 0 and out == "stopped\n"
