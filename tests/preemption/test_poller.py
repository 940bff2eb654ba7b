"""The one loop: errors logged once and counted, never a notice; de-duplication; stop."""

from __future__ import annotations

import math
import os
import socket
import threading
import time
from collections.abc import Callable, MutableMapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
from structlog.testing import capture_logs

from sidecar.model import Notice
from sidecar.preemption.aws import AwsSpotSource
from sidecar.preemption.options import AwsMetadataOptions
from sidecar.preemption.poller import MAX_DEADLINE_SECONDS, Poller
from sidecar.preemption.trigger import TriggerFileSource

if TYPE_CHECKING:
    from tests.servers.metadata_aws import FakeAwsMetadata

pytest_plugins = ["tests.servers.metadata_aws"]


def _until(pred: Callable[[], bool], timeout: float = 5.0) -> None:
    end = time.monotonic() + timeout
    while not pred():
        assert time.monotonic() < end, "condition not met in time"
        threading.Event().wait(0.01)


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
    return port


def _place(path: Path, text: str) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def _aws(url: str, interval: float = 0.02) -> AwsSpotSource:
    return AwsSpotSource(AwsMetadataOptions(interval_seconds=interval), url)


def test_repeated_connection_errors_are_logged_once_counted_and_never_a_notice() -> None:
    notices: list[Notice] = []
    counted: list[tuple[str, str]] = []
    src = _aws(f"http://127.0.0.1:{_closed_port()}")
    poller = Poller(
        [src], notices.append, on_error=lambda s, k: counted.append((s, k)), retry_delay=0.01
    )
    with capture_logs() as logs:
        poller.start()
        try:
            _until(lambda: poller.error_counts().get(("aws", "connection"), 0) >= 5)
        finally:
            assert poller.stop()
    errors = [e for e in logs if e["event"] == "preemption.error"]
    assert len(errors) == 1
    assert (errors[0]["source"], errors[0]["kind"]) == ("aws", "connection")
    assert errors[0]["log_level"] == "warning"
    assert notices == []
    assert [e for e in logs if e["event"] == "preemption.notice"] == []
    assert len(counted) == poller.error_counts()[("aws", "connection")]
    health = poller.health()[0]
    assert (health.ok, health.last_error) == (False, "connection")
    assert health.consecutive_errors >= 5


def test_an_error_kind_is_logged_again_only_after_the_quiet_period() -> None:
    src = _aws(f"http://127.0.0.1:{_closed_port()}")
    notices: list[Notice] = []
    poller = Poller([src], notices.append, retry_delay=0.01, relog_after_seconds=0.0)
    with capture_logs() as logs:
        poller.start()
        try:
            _until(lambda: poller.error_counts().get(("aws", "connection"), 0) >= 3)
        finally:
            assert poller.stop()
    assert len([e for e in logs if e["event"] == "preemption.error"]) >= 3


def test_server_going_away_is_an_error_not_a_notice(aws_metadata: FakeAwsMetadata) -> None:
    notices: list[Notice] = []
    poller = Poller([_aws(aws_metadata.url)], notices.append, retry_delay=0.01)
    poller.start()
    try:
        _until(lambda: poller.health()[0].polls >= 2)
        aws_metadata.stop()
        _until(lambda: sum(poller.error_counts().values()) >= 3)
    finally:
        assert poller.stop()
    assert notices == []


def test_one_notice_is_handled_once(aws_metadata: FakeAwsMetadata) -> None:
    notices: list[Notice] = []
    aws_metadata.interrupt()
    poller = Poller([_aws(aws_metadata.url)], notices.append)
    with capture_logs() as logs:
        poller.start()
        try:
            _until(lambda: poller.health()[0].polls >= 10)  # ten answers, all the same notice
        finally:
            assert poller.stop()
    assert len(notices) == 1
    assert poller.notices == notices
    assert [e["event"] for e in logs].count("preemption.notice") == 1


def test_a_failing_callback_is_logged_and_later_notices_still_arrive(
    aws_metadata: FakeAwsMetadata,
) -> None:
    seen: list[Notice] = []

    def on_notice(n: Notice) -> None:
        seen.append(n)
        if n.kind == "rebalance":
            raise RuntimeError("drain not ready")

    aws_metadata.recommend_rebalance()
    poller = Poller([_aws(aws_metadata.url)], on_notice)
    with capture_logs() as logs:
        poller.start()
        try:
            _until(lambda: len(seen) == 1)
            aws_metadata.interrupt()
            _until(lambda: len(seen) == 2)
        finally:
            assert poller.stop()
    assert [n.kind for n in seen] == ["rebalance", "terminate"]
    assert [e["event"] for e in logs].count("preemption.callback_failed") == 1


def test_stop_is_prompt_between_polls(aws_metadata: FakeAwsMetadata) -> None:
    notices: list[Notice] = []
    poller = Poller([_aws(aws_metadata.url, interval=60)], notices.append)
    poller.start()
    _until(lambda: poller.health()[0].polls == 1)
    started = time.monotonic()
    assert poller.stop()
    assert time.monotonic() - started < 2.0  # not the 60 s interval


def test_stop_from_inside_the_callback_does_not_deadlock(aws_metadata: FakeAwsMetadata) -> None:
    stopped: list[bool] = []
    aws_metadata.interrupt()

    def on_notice(n: Notice) -> None:
        stopped.append(poller.stop())

    poller = Poller([_aws(aws_metadata.url)], on_notice)
    poller.start()
    _until(lambda: stopped == [True])
    assert poller.stop()


def test_a_blocking_callback_delays_neither_other_sources_nor_stop(tmp_path: Path) -> None:
    release = threading.Event()
    seen: list[str] = []

    def on_notice(n: Notice) -> None:
        seen.append(Path(n.detail["path"]).name)
        if seen[-1] == "a":
            release.wait(5)  # a drain that blocks its caller

    a = TriggerFileSource(tmp_path / "a", default_deadline_seconds=30, interval=0.02)
    b = TriggerFileSource(tmp_path / "b", default_deadline_seconds=30, interval=0.02)
    poller = Poller([a, b], on_notice)
    poller.start()
    try:
        (tmp_path / "a").touch()
        _until(lambda: seen == ["a"])
        (tmp_path / "b").touch()
        _until(lambda: seen == ["a", "b"])
        started = time.monotonic()
        assert not poller.stop(timeout=0.2)  # "a" is still in its callback
        assert time.monotonic() - started < 1.0
    finally:
        release.set()
    assert poller.stop()


class _Scripted:
    """A source that answers from a script: each poll takes the next answer (the last one
    repeats); an exception in the script is raised by that poll."""

    name = "scripted"
    interval = 0.01

    def __init__(self, *answers: Notice | BaseException | None) -> None:
        self._answers = list(answers)
        self.polls = 0

    def poll(self) -> Notice | None:
        self.polls += 1
        answer = self._answers.pop(0) if len(self._answers) > 1 else self._answers[0]
        if isinstance(answer, BaseException):
            raise answer
        return answer

    def acknowledge(self, notice: Notice) -> bool:
        return False

    def close(self) -> None:
        pass


def _notice(event_id: str, *, deadline: float, received_at: float) -> Notice:
    return Notice("file", "trigger", deadline, received_at, time.monotonic() + 30, event_id)


def test_absurd_deadlines_are_clamped_logged_and_the_notices_still_arrive(tmp_path: Path) -> None:
    far = TriggerFileSource(tmp_path / "far", default_deadline_seconds=30, interval=0.02)
    endless = TriggerFileSource(
        tmp_path / "endless", default_deadline_seconds=math.inf, interval=0.02
    )
    past = TriggerFileSource(tmp_path / "past", default_deadline_seconds=30, interval=0.02)
    _place(tmp_path / "far", "1e12")  # seconds from now: year 33715
    _place(tmp_path / "endless", "")  # the default, and it is infinite
    _place(tmp_path / "past", "0001-01-01T00:00:00+14:00")  # before datetime.min in UTC
    notices: list[Notice] = []
    poller = Poller([far, endless, past], notices.append)
    with capture_logs() as logs:
        poller.start()
        try:
            _until(lambda: len(notices) == 3)
            polls = sum(h.polls for h in poller.health())
            _until(lambda: min(h.polls for h in poller.health()) >= polls)  # all still polling
            assert poller.dead_threads() == []
        finally:
            assert poller.stop()
    by_path = {Path(n.detail["path"]).name: n for n in notices}
    for name in ("far", "endless"):
        n = by_path[name]
        assert n.deadline == n.received_at + MAX_DEADLINE_SECONDS
        assert MAX_DEADLINE_SECONDS - 5 < n.deadline_mono - time.monotonic() <= MAX_DEADLINE_SECONDS
    assert by_path["endless"].detail["deadline_given"] == "inf"
    assert by_path["past"].deadline == by_path["past"].received_at
    assert by_path["past"].deadline_mono <= time.monotonic()
    clamped = [e for e in logs if e["event"] == "preemption.deadline_clamped"]
    assert sorted(e["source"] for e in clamped) == ["file", "file#2", "file#3"]
    assert poller.error_counts() == {}


def _run_until_one_notice(poller: Poller, notices: list[Notice]) -> list[MutableMapping[str, Any]]:
    """Run ``poller`` until it delivered a notice; what it logged meanwhile."""
    with capture_logs() as logs:
        poller.start()
        try:
            _until(lambda: len(notices) == 1)
        finally:
            assert poller.stop()
    return logs


def test_a_notice_that_cannot_be_delivered_is_an_error_and_not_marked_seen() -> None:
    broken = _notice("e1", deadline=math.inf, received_at=math.inf)  # no clamp can save it
    now = time.time()
    src = _Scripted(broken, _notice("e1", deadline=now + 30, received_at=now))
    notices: list[Notice] = []
    poller = Poller([src], notices.append, retry_delay=0.01)
    logs = _run_until_one_notice(poller, notices)
    assert notices[0].deadline == now + 30  # the same event id, delivered by the next poll
    assert poller.error_counts() == {("scripted", "internal"): 1}
    assert [e["kind"] for e in logs if e["event"] == "preemption.error"] == ["internal"]


def test_unexpected_exceptions_and_a_failing_on_error_never_end_the_loop() -> None:
    now = time.time()
    src = _Scripted(ValueError("odd reply"), _notice("e2", deadline=now + 30, received_at=now))

    def on_error(source: str, kind: str) -> None:
        raise RuntimeError("metrics are broken")

    notices: list[Notice] = []
    poller = Poller([src], notices.append, on_error=on_error, retry_delay=0.01)
    logs = _run_until_one_notice(poller, notices)
    assert poller.error_counts() == {("scripted", "internal"): 1}
    assert [e["event"] for e in logs].count("preemption.on_error_failed") == 1


@pytest.mark.filterwarnings("ignore::pytest.PytestUnhandledThreadExceptionWarning")
def test_dead_threads_names_a_loop_that_ended_until_stop(tmp_path: Path) -> None:
    alive = TriggerFileSource(tmp_path / "t", default_deadline_seconds=30, interval=0.02)
    dying = _Scripted(SystemExit(3))  # not an Exception: the one way left to end a loop
    poller = Poller([alive, dying], lambda n: None)
    assert poller.dead_threads() == []
    poller.start()
    try:
        _until(lambda: poller.dead_threads() == ["preemption-scripted"])
        assert poller.health()[0].polls >= 1
    finally:
        assert poller.stop()
    assert poller.dead_threads() == []
