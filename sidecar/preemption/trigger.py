"""``file``: a trigger file appearing is a notice (for Slurm scripts and anything else).

The file's content may give the deadline: a number of seconds from now (``90``) or an
RFC 3339 time (``2026-12-02T08:22:00Z``); anything else, or an empty file, means
``default_deadline_seconds``. The file is only read, never removed: removing it is the
operator's business. One file (same device and inode) is one notice; writing it again does
not make another, so write the content first and rename the file into place
(``echo 90 > t.tmp && mv t.tmp trigger``), or a reader may see it still empty.
"""

from __future__ import annotations

import math
import os
from pathlib import Path

from sidecar.model import Notice
from sidecar.preemption.base import SourceError, make_notice, parse_rfc3339

__all__ = ["TriggerFileSource"]

MAX_READ = 4096


class TriggerFileSource:
    """Checks with ``stat`` every ``interval`` seconds whether ``path`` exists."""

    name = "file"

    def __init__(self, path: Path, *, default_deadline_seconds: float, interval: float = 0.5):
        self.path = path
        self.interval = interval
        self._default = default_deadline_seconds

    def poll(self) -> Notice | None:
        try:
            st = os.stat(self.path)
            with open(self.path, "rb") as f:
                text = f.read(MAX_READ).decode("utf-8", "replace").strip()
        except FileNotFoundError:
            return None
        except OSError as e:
            raise SourceError("unreadable", f"trigger file {self.path}: {e.strerror}") from None
        deadline, seconds_left = _deadline(text)
        return make_notice(
            "file",
            "trigger",
            f"file:{self.path}:{st.st_dev}:{st.st_ino}",
            deadline=deadline,
            seconds_left=self._default if seconds_left is None else seconds_left,
            detail={"path": str(self.path), "content": text[:200]},
        )

    def acknowledge(self, notice: Notice) -> bool:
        """Nothing to acknowledge."""
        return False

    def close(self) -> None:
        """Nothing in flight to abort."""


def _deadline(text: str) -> tuple[float | None, float | None]:
    """(absolute deadline, seconds from now) read from the file's content, if any."""
    try:
        seconds = float(text)
    except ValueError:
        return parse_rfc3339(text) if text else None, None
    if not math.isfinite(seconds):
        return None, None
    return None, max(seconds, 0.0)
