"""Trigger-file source: a file appearing is one notice, with the deadline it names."""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path

from sidecar.model import Notice
from sidecar.preemption.poller import Poller
from sidecar.preemption.trigger import TriggerFileSource


def _until(pred: Callable[[], bool], timeout: float = 5.0) -> None:
    end = time.monotonic() + timeout
    while not pred():
        assert time.monotonic() < end, "condition not met in time"
        threading.Event().wait(0.01)


def _place(path: Path, text: str) -> None:
    """Write then rename into place, as the docstring tells scripts to."""
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def test_absent_file_is_no_notice_and_a_present_one_is(tmp_path: Path) -> None:
    path = tmp_path / "drain-now"
    src = TriggerFileSource(path, default_deadline_seconds=45)
    assert src.poll() is None
    _place(path, "")
    notice = src.poll()
    assert notice is not None
    assert (notice.source, notice.kind, notice.drain) == ("file", "trigger", True)
    assert 44 < notice.deadline_mono - time.monotonic() <= 45


def test_content_names_the_deadline(tmp_path: Path) -> None:
    path = tmp_path / "drain-now"
    src = TriggerFileSource(path, default_deadline_seconds=45)
    _place(path, "90\n")
    in_seconds = src.poll()
    assert in_seconds is not None
    assert 89 < in_seconds.deadline_mono - time.monotonic() <= 90
    when = datetime.now(UTC).replace(microsecond=0) + timedelta(minutes=5)
    _place(path, when.strftime("%Y-%m-%dT%H:%M:%SZ"))
    at_time = src.poll()
    assert at_time is not None and at_time.deadline == when.timestamp()
    _place(path, "soon, please")
    unreadable = src.poll()
    assert unreadable is not None
    assert 44 < unreadable.deadline_mono - time.monotonic() <= 45


def test_poller_sees_the_file_appear_once(tmp_path: Path) -> None:
    path = tmp_path / "drain-now"
    src = TriggerFileSource(path, default_deadline_seconds=30, interval=0.05)
    got = threading.Event()
    notices: list[Notice] = []

    def on_notice(n: Notice) -> None:
        notices.append(n)
        got.set()

    poller = Poller([src], on_notice)
    poller.start()
    try:
        _place(path, "")
        assert got.wait(5)
        with path.open("a") as f:  # written again in place: the same file, no new notice
            f.write("120\n")
        polls = poller.health()[0].polls
        _until(lambda: poller.health()[0].polls >= polls + 5)
    finally:
        assert poller.stop()
    assert len(notices) == 1
