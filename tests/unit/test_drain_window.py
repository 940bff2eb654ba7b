"""A drain lasts until the latest deadline of the notices that came during it; the trainer
hears of the drain and of every earlier deadline; a notice after the drain starts a new one."""

from __future__ import annotations

import functools
import json
import threading
import time
from collections.abc import Callable, MutableMapping
from pathlib import Path
from types import SimpleNamespace
from typing import Any, cast

from structlog.testing import capture_logs

from sidecar.drain import NOTICE_FILE, DrainController
from sidecar.metrics import Metrics
from sidecar.model import CheckpointReady, EntryKind, FileEntry, FileState, Notice
from sidecar.queue import CheckpointQueue
from sidecar.unprotected import Unprotected
from sidecar.upload.bandwidth import BandwidthLimiter
from sidecar.upload.throughput import ThroughputMeter


def _daemon(root: Path) -> Any:
    """The parts of a daemon a drain reads, idle: nothing queued, nothing in flight."""
    cfg = SimpleNamespace(
        watch=SimpleNamespace(path=root, settle_seconds=0.1),
        preemption=SimpleNamespace(notify_signal=None, notify_pid_file=None),
    )
    return SimpleNamespace(
        cfg=cfg,
        metrics=Metrics(),
        limiter=BandwidthLimiter(0),
        queue=CheckpointQueue(4, 1 << 30),
        pending=Unprotected(),
        lock=threading.Lock(),
        current=None,
        current_cancel=threading.Event(),
        current_start_bytes=0,
        pool=SimpleNamespace(meter=ThroughputMeter()),
        health=SimpleNamespace(watching=True),
        watcher=SimpleNamespace(rescan=lambda: None, in_progress=lambda: [], mode="inotify"),
        last_committed=None,
        request_stop=lambda: None,
    )


def _notice(name: str, seconds: float) -> Notice:
    now, mono = time.time(), time.monotonic()
    return Notice("signal", name, now + seconds, now, mono + seconds, event_id=name)


def _told(root: Path) -> str:
    try:
        return str(json.loads((root / NOTICE_FILE).read_text())["kind"])
    except FileNotFoundError:
        return ""


def _until(done: Callable[[], bool], bound: float = 15.0) -> None:
    """Wait for ``done`` (a drain's own thread makes it true); fail after ``bound`` s."""
    end = time.monotonic() + bound
    while not done():
        assert time.monotonic() < end, "the drain never got there"
        time.sleep(0.01)


def _started(logs: list[MutableMapping[str, Any]], kind: str) -> bool:
    return any(e["event"] == "drain.started" and e["kind"] == kind for e in logs)


def _in_turn(
    drain: DrainController, logs: list[MutableMapping[str, Any]], *notices: Notice
) -> None:
    """Each notice's drain starts on its own thread, as the daemon's do; returns once each
    has logged ``drain.started`` (after telling the trainer, when it does)."""
    for n in notices:
        threading.Thread(target=drain.start, args=(n,), kwargs={"exit_after": False}).start()
        _until(functools.partial(_started, logs, n.kind))


def _all_done(logs: list[MutableMapping[str, Any]], n: int) -> None:
    """Wait for the ``drain.done`` of each of the test's ``n`` drains, so none of them logs
    into the next test's capture."""
    _until(lambda: len([e for e in logs if e["event"] == "drain.done"]) >= n)


def test_a_later_notice_during_a_drain_keeps_it_draining_until_its_deadline(
    tmp_path: Path,
) -> None:
    """A preStop drain of 1 s, then the cloud's own notice of 4 s: still a drain at 2 s."""
    drain = DrainController(cast("Any", _daemon(tmp_path)))
    with capture_logs() as logs:
        _in_turn(drain, logs, _notice("prestop", 1.0), _notice("aws", 4.0))
        assert drain.state == "draining" and _told(tmp_path) == "prestop"
        time.sleep(2.0)  # past the first deadline: there is nothing to wait on but the clock
        assert drain.state == "draining", "the cloud's deadline is still ahead"
        _all_done(logs, 2)


def test_an_earlier_deadline_is_told_to_the_trainer_and_a_passed_one_ends_nothing(
    tmp_path: Path,
) -> None:
    drain = DrainController(cast("Any", _daemon(tmp_path)))
    with capture_logs() as logs:
        _in_turn(drain, logs, _notice("usr1", 3.0), _notice("azure", -1.0))
        assert _told(tmp_path) == "azure", "the trainer was not told of the earlier deadline"
        assert drain.state == "draining", "a notice already past ended the drain"
        _all_done(logs, 2)


def test_a_notice_after_the_drain_starts_a_new_one(tmp_path: Path) -> None:
    drain = DrainController(cast("Any", _daemon(tmp_path)))
    with capture_logs() as logs:
        _in_turn(drain, logs, _notice("usr1", 0.3))
        time.sleep(0.6)  # past its deadline: there is nothing to wait on but the clock
        assert drain.state == "running"
        _in_turn(drain, logs, _notice("terminate", 5.0))
        assert drain.state == "draining" and _told(tmp_path) == "terminate"
        _all_done(logs, 2)


def test_each_drain_waits_for_its_own_deadline_while_work_is_pending(tmp_path: Path) -> None:
    """preStop (1 s), then the cloud's notice (3 s), a checkpoint not yet durable: the
    cloud's drain does not report at the preStop's deadline, and the preStop's (like a
    SIGTERM's, whose grace is all the kubelet gives) does not wait for the cloud's."""
    d = _daemon(tmp_path)
    d.pending.add(
        CheckpointReady("step_7.pt", EntryKind.CHECKPOINT, False, (), 7, 0.0, time.monotonic())
    )
    drain = DrainController(cast("Any", d))
    with capture_logs() as logs:
        _in_turn(drain, logs, _notice("prestop", 1.0), _notice("aws", 3.0))
        _all_done(logs, 2)
    first, second = sorted(e["seconds"] for e in logs if e["event"] == "drain.done")
    assert 0.7 <= first <= 1.6, "the preStop drain did not keep to its own deadline"
    assert second >= 2.5, "the cloud's drain reported at the preStop's deadline"
    assert all(e["not_durable"] == ["step_7.pt"] for e in logs if e["event"] == "drain.done")


def test_the_exit_status_is_the_stopping_drains_whatever_reports_later(tmp_path: Path) -> None:
    """SIGTERM (0.5 s) during a cloud drain (2 s), a checkpoint pending: the SIGTERM drain
    reports 4 and stops the daemon; the cloud drain's later report does not change that."""
    d = _daemon(tmp_path)
    item = CheckpointReady("step_7.pt", EntryKind.CHECKPOINT, False, (), 7, 0.0, time.monotonic())
    d.pending.add(item)
    stops: list[int] = []
    drain = DrainController(cast("Any", d))
    d.request_stop = lambda: stops.append(drain.exit_code)
    with capture_logs() as logs:
        _in_turn(drain, logs, _notice("aws", 2.0))
        term = _notice("terminate", 0.5)
        threading.Thread(target=drain.start, args=(term,), kwargs={"exit_after": True}).start()
        _all_done(logs, 1)
        d.pending.committed(item)  # the upload finishes after the daemon was told to stop
        _all_done(logs, 2)
    assert stops == [4] and drain.exit_code == 4


def _sized(name: str, step: int, size: int) -> CheckpointReady:
    f = FileEntry(name, Path(name), FileState(size, 0, 0))
    return CheckpointReady(name, EntryKind.CHECKPOINT, False, (f,), step, 0.0, float(step))


_DECISIONS = ("drain.older_first", "drain.cancel_older")


def _decision_under_cap(folder: Path, cap: int) -> tuple[list[str], bool]:
    """A drain of step_2 (500 MB) while step_1 (6 MB) uploads, 30 s to go, about 1 MB/s
    measured in the last seconds: what it decided, and whether it cancelled step_1."""
    folder.mkdir()
    d = _daemon(folder)
    d.limiter = BandwidthLimiter(cap)
    d.pool.meter.add(5_000_000)
    d.current, d.current_start_bytes = _sized("step_1.pt", 1, 6_000_000), 0
    d.queue.put(_sized("step_2.pt", 2, 500_000_000))
    drain = DrainController(d)
    with capture_logs() as logs:
        threading.Thread(
            target=drain.start,
            args=(_notice(f"cap{cap}", 30),),
            kwargs={"exit_after": False},
            daemon=True,
        ).start()
        _until(lambda: any(e["event"] in _DECISIONS for e in logs))
    cancelled = d.current_cancel.is_set()
    d.current = None  # let the drain end: nothing in flight, nothing queued
    d.queue.get_checkpoint(timeout=0)
    drain.after_item()
    _until(lambda: drain.outcome is not None)
    return [e["event"] for e in logs if e["event"] in _DECISIONS], cancelled


def test_a_rate_measured_under_the_bandwidth_cap_does_not_put_the_older_first(
    tmp_path: Path,
) -> None:
    """The cap (lifted only as the drain starts) made the link look slow: the newest looked
    out of reach and the older one was left to finish first, though at the link's real
    speed the newest would have made it. Under a cap, the newest goes first."""
    assert _decision_under_cap(tmp_path / "uncapped", 0) == (["drain.older_first"], False)
    assert _decision_under_cap(tmp_path / "capped", 1_000_000) == (["drain.cancel_older"], True)
