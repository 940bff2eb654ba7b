"""What a child upload tool of a benchmark imports: nothing heavy, so the start-up CPU it
reports is its own (interpreter, its imports, its client), not the benchmark's."""

from __future__ import annotations

import os

__all__ = ["parse_setup_cpu", "setup_done"]


def setup_done() -> None:
    """In a child upload tool: print the CPU this process has spent so far (interpreter
    start, imports, client or backend set-up; ``os.times()`` user + system) as the line
    ``setup_cpu <seconds>`` on stdout. Call it once, after the client is built and before
    the first byte is read, so the parent can report the CPU per GB with and without it."""
    t = os.times()
    print(f"setup_cpu {t.user + t.system:.3f}", flush=True)


def parse_setup_cpu(out: str) -> float | None:
    """The seconds of the first ``setup_cpu <seconds>`` line in a child's stdout, or None."""
    for line in out.splitlines():
        if line.startswith("setup_cpu "):
            return float(line.split()[1])
    return None
