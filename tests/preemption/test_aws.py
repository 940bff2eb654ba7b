"""AWS source against the fake IMDS: spot interruption, rebalance, token rules, hop limit."""

from __future__ import annotations

import http.client
import socket
import threading
import time
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from urllib.parse import urlsplit

import pytest
from structlog.testing import capture_logs

from sidecar.model import Notice
from sidecar.preemption.aws import HOP_LIMIT_FIX, AwsSpotSource, endpoint_from
from sidecar.preemption.base import SourceError
from sidecar.preemption.options import AwsMetadataOptions
from sidecar.preemption.poller import MAX_DEADLINE_SECONDS, Poller
from tests.servers.metadata_aws import ACTION_PATH, FakeAwsMetadata

pytest_plugins = ["tests.servers.metadata_aws"]


def _until(pred: Callable[[], bool], timeout: float = 5.0) -> None:
    end = time.monotonic() + timeout
    while not pred():
        assert time.monotonic() < end, "condition not met in time"
        threading.Event().wait(0.01)


def _source(fake: FakeAwsMetadata, **opts: object) -> AwsSpotSource:
    return AwsSpotSource(AwsMetadataOptions.model_validate(opts), fake.url)


def test_interruption_is_seen_by_the_first_poll_after_it_appears(
    aws_metadata: FakeAwsMetadata,
) -> None:
    src = _source(aws_metadata)
    assert src.poll() is None  # both documents 404
    when = datetime.now(UTC).replace(microsecond=0) + timedelta(seconds=100)
    aws_metadata.interrupt("stop", at=when)
    notice = src.poll()
    assert notice is not None
    assert (notice.source, notice.kind, notice.drain) == ("aws", "stop", True)
    assert notice.deadline == when.timestamp()
    left = notice.deadline_mono - time.monotonic()
    assert 95 < left <= 100
    assert len(aws_metadata.hits("PUT")) == 1  # one token serves every request
    assert aws_metadata.hits(status=401) == []


def test_rebalance_is_an_early_warning_and_never_masks_the_interruption(
    aws_metadata: FakeAwsMetadata,
) -> None:
    src = _source(aws_metadata, rebalance_horizon_seconds=300)
    aws_metadata.recommend_rebalance()
    warning = src.poll()
    assert warning is not None
    assert (warning.kind, warning.drain) == ("rebalance", False)
    assert 290 < warning.deadline_mono - time.monotonic() <= 300
    aws_metadata.interrupt("terminate")
    notice = src.poll()
    assert notice is not None
    assert (notice.kind, notice.drain) == ("terminate", True)
    assert notice.event_id != warning.event_id


def test_rebalance_can_be_turned_off(aws_metadata: FakeAwsMetadata) -> None:
    aws_metadata.recommend_rebalance()
    assert _source(aws_metadata, rebalance=False).poll() is None


def test_expired_token_is_replaced_on_401_without_an_error(aws_metadata: FakeAwsMetadata) -> None:
    src = _source(aws_metadata)
    assert src.poll() is None
    aws_metadata.expire_tokens()
    assert src.poll() is None  # 401, new token, retried: no SourceError
    assert len(aws_metadata.hits("GET", 401)) == 1
    assert len(aws_metadata.hits("PUT", 200)) == 2
    aws_metadata.interrupt()
    assert src.poll() is not None


def test_token_is_renewed_before_it_expires(aws_metadata: FakeAwsMetadata) -> None:
    src = _source(aws_metadata, token_ttl_seconds=1)

    def renewed() -> bool:
        assert src.poll() is None
        return len(aws_metadata.hits("PUT")) >= 3

    _until(renewed)
    assert aws_metadata.hits(status=401) == []  # never used a token past its TTL


def _status(url: str, method: str = "GET", headers: dict[str, str] | None = None) -> int:
    parts = urlsplit(url)
    conn = http.client.HTTPConnection(parts.netloc, timeout=2)
    try:
        conn.request(method, parts.path, headers=headers or {})
        resp = conn.getresponse()
        resp.read()
        return resp.status
    finally:
        conn.close()


def test_fake_is_imdsv2_only(aws_metadata: FakeAwsMetadata) -> None:
    assert _status(aws_metadata.url + "/latest/meta-data/instance-id") == 401
    token_url = aws_metadata.url + "/latest/api/token"
    assert _status(token_url, "PUT") == 400  # no TTL header
    assert _status(token_url, "PUT", {"X-aws-ec2-metadata-token-ttl-seconds": "21601"}) == 400
    forwarded = {"X-aws-ec2-metadata-token-ttl-seconds": "60", "X-Forwarded-For": "10.0.0.9"}
    assert _status(token_url, "PUT", forwarded) == 403


def test_hanging_token_put_times_out_fast_and_is_reported_once_with_the_fix(
    aws_metadata: FakeAwsMetadata,
) -> None:
    aws_metadata.hang_token_put()
    src = _source(aws_metadata, timeout_seconds=0.3)
    started = time.monotonic()
    with pytest.raises(SourceError) as err:
        src.poll()
    assert time.monotonic() - started < 1.5
    assert err.value.kind == "token_timeout"
    assert "hop-limit 2" in (err.value.fix or "")

    notices: list[Notice] = []
    poller = Poller([src], notices.append, retry_delay=0.01, retry_delay_max=0.02)
    with capture_logs() as logs:
        poller.start()
        _until(lambda: poller.error_counts().get(("aws", "token_timeout"), 0) >= 3)
        assert poller.stop()
    errors = [e for e in logs if e["event"] == "preemption.error"]
    assert len(errors) == 1
    assert errors[0]["kind"] == "token_timeout"
    assert errors[0]["fix"] == HOP_LIMIT_FIX
    assert notices == []
    assert not poller.health()[0].ok


def test_connection_refused_is_an_error_not_a_notice() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    src = AwsSpotSource(AwsMetadataOptions(), f"http://127.0.0.1:{port}")
    with pytest.raises(SourceError) as err:
        src.poll()
    assert err.value.kind == "connection"


def test_endpoint_follows_botocore_environment() -> None:
    opts = AwsMetadataOptions()
    assert endpoint_from(opts, {}) == "http://169.254.169.254"
    env = {"AWS_EC2_METADATA_SERVICE_ENDPOINT": "http://127.0.0.1:1338"}
    assert endpoint_from(opts, env) == "http://127.0.0.1:1338"
    assert endpoint_from(opts, {"AWS_EC2_METADATA_SERVICE_ENDPOINT_MODE": "IPv6"}) == (
        "http://[fd00:ec2::254]"
    )
    assert endpoint_from(AwsMetadataOptions(endpoint="http://10.0.0.1"), env) == "http://10.0.0.1"


def test_poller_delivers_the_interruption_within_one_interval(
    aws_metadata: FakeAwsMetadata,
) -> None:
    got = threading.Event()
    notices: list[Notice] = []
    received: list[float] = []

    def on_notice(n: Notice) -> None:
        received.append(time.monotonic())
        notices.append(n)
        got.set()

    poller = Poller([_source(aws_metadata, interval_seconds=0.25)], on_notice)
    poller.start()
    try:
        _until(lambda: len(aws_metadata.hits("GET")) >= 2)
        aws_metadata.interrupt()
        assert got.wait(5)
        assert aws_metadata.flipped_at is not None
        latency = received[0] - aws_metadata.flipped_at
        assert latency < 0.25 + 0.5  # one interval, plus scheduling slack on a busy machine
    finally:
        assert poller.stop()
    assert [n.kind for n in notices] == ["terminate"]


class _RawAwsMetadata(FakeAwsMetadata):
    """The fake IMDS, also able to answer ``spot/instance-action`` with any body at all."""

    def publish_raw(self, body: bytes) -> None:
        with self._cond:
            self._documents[ACTION_PATH] = body
            self.flipped_at = time.monotonic()


@pytest.fixture
def raw_aws() -> Iterator[_RawAwsMetadata]:
    fake = _RawAwsMetadata().start()
    try:
        yield fake
    finally:
        fake.stop()


def test_a_malformed_instance_action_is_a_notice_once_per_distinct_body(
    raw_aws: _RawAwsMetadata,
) -> None:
    src = AwsSpotSource(AwsMetadataOptions(default_deadline_seconds=90), raw_aws.url)
    when = datetime.now(UTC).replace(microsecond=0) + timedelta(seconds=100)
    for not_an_object in (b"<html>maintenance</html>", b'["terminate"]'):
        raw_aws.publish_raw(not_an_object)  # not the metadata service speaking: no notice
        with pytest.raises(SourceError, match="not a JSON object"):
            src.poll()
    cases = [
        (b'{"time": "' + when.strftime("%Y-%m-%dT%H:%M:%SZ").encode() + b'"}', "unknown", when),
        (b'{"action": 7, "time": "soon"}', "unknown", None),
        (b'{"action": "stop", "time": "tomorrow"}', "stop", None),
    ]
    ids = []
    with capture_logs() as logs:
        for body, kind, at in cases:
            raw_aws.publish_raw(body)
            first, again = src.poll(), src.poll()
            assert first is not None and again is not None
            assert first.event_id == again.event_id  # the same body: one event
            assert (first.source, first.kind, first.drain) == ("aws", kind, True)
            if at is None:
                assert 85 < first.deadline_mono - time.monotonic() <= 90
            else:
                assert first.deadline == at.timestamp()
            ids.append(first.event_id)
    assert len(set(ids)) == len(cases)
    reported = [e for e in logs if e["event"] == "preemption.malformed_event"]
    assert len(reported) == len(cases)  # once per body, not once per poll
    assert reported[0]["reason"] == "no readable 'action'"
    assert reported[1]["reason"] == "no readable 'action' or 'time'"
    assert reported[2]["reason"] == "no readable 'time'"
    assert reported[1]["default_deadline_seconds"] == 90


def test_an_action_time_beyond_datetime_is_clamped_and_delivered(
    raw_aws: _RawAwsMetadata,
) -> None:
    raw_aws.publish_raw(b'{"action": "terminate", "time": "9999-12-31T23:59:59-12:00"}')
    notices: list[Notice] = []
    poller = Poller([_source(raw_aws, interval_seconds=0.02)], notices.append)
    with capture_logs() as logs:
        poller.start()
        try:
            _until(lambda: len(notices) == 1)
            polls = poller.health()[0].polls
            _until(lambda: poller.health()[0].polls >= polls + 3)
            assert poller.dead_threads() == []
        finally:
            assert poller.stop()
    n = notices[0]
    assert (n.kind, n.deadline) == ("terminate", n.received_at + MAX_DEADLINE_SECONDS)
    assert [e["event"] for e in logs].count("preemption.deadline_clamped") == 1
    assert poller.error_counts() == {}
