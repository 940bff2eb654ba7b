"""The one loop: errors logged once and counted, never a notice; de-duplication; stop."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from structlog.testing import capture_logs

from sidecar.model import Notice
from sidecar.preemption.aws import AwsSpotSource
from sidecar.preemption.options import AwsMetadataOptions
from sidecar.preemption.poller import Poller
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
