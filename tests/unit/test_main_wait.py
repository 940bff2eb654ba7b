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
import signal, sys, threading
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
if sys.argv[1] == "main-wait":
    waiter.wait(done)
else:  # the wait this replaced, without its 0.5 s timeout
    done.wait()
print("stopped", flush=True)
"""


def run(how: str) -> subprocess.CompletedProcess[str] | None:
    """Start the script, send SIGTERM once it waits; its output, or None if it did not end.
    (With ``how`` = ``event-wait``, the wait MainWait replaced, it does not end.)"""
    with subprocess.Popen(
        [sys.executable, "-c", SCRIPT, how], cwd=ROOT, stdout=subprocess.PIPE, text=True
    ) as p:
        assert p.stdout is not None
        assert p.stdout.readline() == "ready\n"
        p.send_signal(signal.SIGTERM)
        try:
            out, _ = p.communicate(timeout=BOUND)
        except subprocess.TimeoutExpired:
            p.kill()
            return None
        return subprocess.CompletedProcess(p.args, p.returncode, out)


def test_a_signal_taken_by_another_thread_ends_the_wait() -> None:
    done = run("main-wait")
    assert done is not None, "the main thread slept through SIGTERM"
    assert done.returncode == 0 and done.stdout == "stopped\n"
