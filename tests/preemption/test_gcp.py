"""GCP source against the fake metadata server: wait_for_change, ETags, 503, maintenance."""

from __future__ import annotations

import http.client
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from structlog.testing import capture_logs

from sidecar.model import Notice
from sidecar.preemption.gcp import endpoint_from, maintenance_watch, preempted_watch
from sidecar.preemption.options import GcpMetadataOptions
from sidecar.preemption.poller import Poller

if TYPE_CHECKING:
    from tests.servers.metadata_gcp import FakeGcpMetadata

pytest_plugins = ["tests.servers.metadata_gcp"]


def _until(pred: Callable[[], bool], timeout: float = 5.0) -> None:
    end = time.monotonic() + timeout
    while not pred():
        assert time.monotonic() < end, "condition not met in time"
        threading.Event().wait(0.01)


def _opts(**kw: object) -> GcpMetadataOptions:
    return GcpMetadataOptions.model_validate({"wait_timeout_seconds": 30, **kw})


def _endpoint(fake: FakeGcpMetadata) -> str:
    return endpoint_from(GcpMetadataOptions(), {"GCE_METADATA_HOST": fake.host})


def _get(fake: FakeGcpMetadata, path: str, headers: dict[str, str]) -> tuple[int, str, str]:
    conn = http.client.HTTPConnection(fake.host, timeout=5)
    try:
        conn.request("GET", "/computeMetadata/v1/" + path, headers=headers)
        resp = conn.getresponse()
        return resp.status, resp.read().decode(), resp.headers.get("ETag", "")
    finally:
        conn.close()


def test_preemption_arrives_at_once_through_wait_for_change(
    gcp_metadata: FakeGcpMetadata,
) -> None:
    src = preempted_watch(_opts(), _endpoint(gcp_metadata))
    assert src.poll() is None  # FALSE, and now we hold its ETag
    result: list[Notice | None] = []
    returned_at: list[float] = []

    def long_poll() -> None:
        result.append(src.poll())
        returned_at.append(time.monotonic())

    t = threading.Thread(target=long_poll)
    t.start()
    _until(lambda: gcp_metadata.waiting == 1)  # the hanging GET is in the server
    gcp_metadata.preempt()
    t.join(5)
    assert not t.is_alive()
    notice = result[0]
    assert notice is not None
    assert (notice.source, notice.kind, notice.drain) == ("gcp", "preempt", True)
    assert gcp_metadata.flipped_at is not None
    assert returned_at[0] - gcp_metadata.flipped_at < 2.0  # not the 30 s timeout_sec
    assert 29 < notice.deadline_mono - time.monotonic() <= 30
    assert abs(notice.deadline - notice.received_at - 30) < 0.01


def test_already_preempted_at_start_is_a_notice_on_the_first_poll(
    gcp_metadata: FakeGcpMetadata,
) -> None:
    gcp_metadata.preempt()
    notice = preempted_watch(_opts(), _endpoint(gcp_metadata)).poll()
    assert notice is not None and notice.kind == "preempt"


def test_long_poll_timeout_returns_the_same_value_and_no_notice(
    gcp_metadata: FakeGcpMetadata,
) -> None:
    src = preempted_watch(_opts(wait_timeout_seconds=1), _endpoint(gcp_metadata))
    assert src.poll() is None
    started = time.monotonic()
    assert src.poll() is None  # hung for timeout_sec, then FALSE again
    assert time.monotonic() - started >= 0.9


def test_maintenance_terminate_is_a_notice_and_migrate_is_not(
    gcp_metadata: FakeGcpMetadata,
) -> None:
    src = maintenance_watch(_opts(maintenance_deadline_seconds=60), _endpoint(gcp_metadata))
    assert src.poll() is None
    gcp_metadata.set("instance/maintenance-event", "MIGRATE_ON_HOST_MAINTENANCE")
    assert src.poll() is None  # ETag changed: answered at once, a live migration
    gcp_metadata.set("instance/maintenance-event", "TERMINATE_ON_HOST_MAINTENANCE")
    notice = src.poll()
    assert notice is not None
    assert (notice.kind, notice.drain) == ("terminate", True)
    assert 59 < notice.deadline_mono - time.monotonic() <= 60


def test_503_is_retried_and_reported_once(gcp_metadata: FakeGcpMetadata) -> None:
    got = threading.Event()
    notices: list[Notice] = []

    def on_notice(n: Notice) -> None:
        notices.append(n)
        got.set()

    gcp_metadata.fail_next(3, 503)
    src = preempted_watch(_opts(), _endpoint(gcp_metadata))
    poller = Poller([src], on_notice, retry_delay=0.01, retry_delay_max=0.05)
    with capture_logs() as logs:
        poller.start()
        try:
            _until(lambda: gcp_metadata.waiting == 1)
            gcp_metadata.preempt()
            assert got.wait(5)
        finally:
            assert poller.stop()
    assert poller.error_counts() == {("gcp:preempted", "http_503"): 3}
    events = [e["event"] for e in logs]
    assert events.count("preemption.error") == 1
    assert "preemption.recovered" in events
    assert [n.kind for n in notices] == ["preempt"]


def test_stop_is_prompt_while_wait_for_change_hangs(gcp_metadata: FakeGcpMetadata) -> None:
    opts = _opts(wait_timeout_seconds=60)
    endpoint = _endpoint(gcp_metadata)
    notices: list[Notice] = []
    watches = [preempted_watch(opts, endpoint), maintenance_watch(opts, endpoint)]
    poller = Poller(watches, notices.append)
    poller.start()
    _until(lambda: gcp_metadata.waiting == 2)
    started = time.monotonic()
    assert poller.stop(timeout=1.0)
    assert time.monotonic() - started < 1.0
    assert notices == []


def test_fake_checks_the_header_and_keeps_etags_tied_to_values(
    gcp_metadata: FakeGcpMetadata,
) -> None:
    assert _get(gcp_metadata, "instance/preempted", {})[0] == 403
    flavor = {"Metadata-Flavor": "Google"}
    proxied = {**flavor, "X-Forwarded-For": "10.0.0.9"}
    assert _get(gcp_metadata, "instance/preempted", proxied)[0] == 403
    status, value, etag = _get(gcp_metadata, "instance/preempted", flavor)
    assert (status, value) == (200, "FALSE")
    gcp_metadata.set("instance/preempted", "FALSE")
    assert _get(gcp_metadata, "instance/preempted", flavor)[2] == etag
    gcp_metadata.preempt()
    assert _get(gcp_metadata, "instance/preempted", flavor)[2] != etag
    stale = f"instance/preempted?wait_for_change=true&last_etag={etag}&timeout_sec=30"
    assert _get(gcp_metadata, stale, flavor)[1] == "TRUE"  # answered at once: ETag differs


def test_endpoint_follows_gce_metadata_host() -> None:
    assert endpoint_from(GcpMetadataOptions(), {}) == "http://metadata.google.internal"
    env = {"GCE_METADATA_HOST": "127.0.0.1:8080"}
    assert endpoint_from(GcpMetadataOptions(), env) == "http://127.0.0.1:8080"
    assert endpoint_from(GcpMetadataOptions(host="10.1.2.3"), env) == "http://10.1.2.3"
