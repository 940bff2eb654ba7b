"""Azure source against the fake Scheduled Events service."""

from __future__ import annotations

import http.client
import threading
import time
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from urllib.parse import urlsplit

import pytest
from structlog.testing import capture_logs

from sidecar.model import Notice
from sidecar.preemption.azure import DEFAULT_DEADLINE_SECONDS, AzureScheduledEventsSource
from sidecar.preemption.base import SourceError
from sidecar.preemption.options import AzureMetadataOptions
from sidecar.preemption.poller import Poller
from tests.servers.metadata_azure import FakeAzureMetadata

pytest_plugins = ["tests.servers.metadata_azure"]


def _until(pred: Callable[[], bool], timeout: float = 5.0) -> None:
    end = time.monotonic() + timeout
    while not pred():
        assert time.monotonic() < end, "condition not met in time"
        threading.Event().wait(0.01)


def _source(fake: FakeAzureMetadata, **opts: object) -> AzureScheduledEventsSource:
    return AzureScheduledEventsSource(
        AzureMetadataOptions.model_validate({"base_url": fake.url, **opts})
    )


def test_preempt_for_this_vm_is_seen_by_the_next_poll_with_not_before_as_deadline(
    azure_metadata: FakeAzureMetadata,
) -> None:
    src = _source(azure_metadata)
    assert src.poll() is None
    not_before = datetime.now(UTC).replace(microsecond=0) + timedelta(seconds=30)
    event_id = azure_metadata.schedule("Preempt", not_before=not_before)
    notice = src.poll()
    assert notice is not None
    assert (notice.source, notice.kind, notice.drain) == ("azure", "preempt", True)
    assert notice.deadline == not_before.timestamp()
    assert notice.event_id == f"azure:{event_id}"
    assert notice.detail["event_status"] == "Scheduled"
    assert 25 < notice.deadline_mono - time.monotonic() <= 30


def test_other_vms_and_other_event_types_are_ignored(azure_metadata: FakeAzureMetadata) -> None:
    src = _source(azure_metadata)
    azure_metadata.schedule("Preempt", resources=["gpu-vm-7"])
    azure_metadata.schedule("Terminate", resources=["gpu-vm-7", "gpu-vm-8"])
    azure_metadata.schedule("Reboot")
    azure_metadata.schedule("Freeze")
    assert src.poll() is None
    azure_metadata.schedule("Terminate", resources=["gpu-vm-7", "GPU-VM-0"])  # names: any case
    notice = src.poll()
    assert notice is not None and notice.kind == "terminate"


def test_started_event_has_a_deadline_of_now(azure_metadata: FakeAzureMetadata) -> None:
    event_id = azure_metadata.schedule("Preempt")
    azure_metadata.start_event(event_id)
    notice = _source(azure_metadata).poll()
    assert notice is not None
    assert notice.detail["not_before"] == ""
    assert abs(notice.deadline - notice.received_at) < 0.5


def test_one_event_scheduled_started_and_gone_is_one_notice(
    azure_metadata: FakeAzureMetadata,
) -> None:
    notices: list[Notice] = []
    poller = Poller([_source(azure_metadata, interval_seconds=0.05)], notices.append)
    poller.start()
    try:
        event_id = azure_metadata.schedule("Preempt")
        _until(lambda: len(notices) == 1)
        calls = azure_metadata.event_calls
        azure_metadata.start_event(event_id)
        _until(lambda: azure_metadata.event_calls >= calls + 3)
        azure_metadata.finish(event_id)
        _until(lambda: azure_metadata.event_calls >= calls + 6)
    finally:
        assert poller.stop()
    assert [n.event_id for n in notices] == [f"azure:{event_id}"]
    assert notices[0].detail["event_status"] == "Scheduled"


def test_slow_first_call_gets_its_own_timeout(azure_metadata: FakeAzureMetadata) -> None:
    azure_metadata.first_call_delay = 0.8
    src = _source(azure_metadata, timeout_seconds=0.3, first_call_timeout_seconds=5)
    assert src.poll() is None  # waited for the slow first answer: no error
    assert src.poll() is None


def test_slow_first_call_times_out_with_a_short_first_call_timeout(
    azure_metadata: FakeAzureMetadata,
) -> None:
    azure_metadata.first_call_delay = 0.8
    src = _source(azure_metadata, timeout_seconds=0.3, first_call_timeout_seconds=0.3)
    with pytest.raises(SourceError) as err:
        src.poll()
    assert err.value.kind == "timeout"


def test_never_acknowledges_by_default(azure_metadata: FakeAzureMetadata) -> None:
    src = _source(azure_metadata)
    azure_metadata.schedule("Preempt")
    notice = src.poll()
    assert notice is not None
    assert not src.acknowledge(notice)
    assert azure_metadata.approved == []
    again = src.poll()
    assert again is not None and again.detail["event_status"] == "Scheduled"


def test_acknowledges_after_flush_when_configured(azure_metadata: FakeAzureMetadata) -> None:
    src = _source(azure_metadata, acknowledge="after_flush")
    event_id = azure_metadata.schedule("Preempt")
    notices: list[Notice] = []
    poller = Poller([src], notices.append)
    poller.start()
    try:
        _until(lambda: len(notices) == 1)
    finally:
        assert poller.stop()
    with capture_logs() as logs:
        assert poller.acknowledge(notices[0])  # after the flush, polling already stopped
    assert azure_metadata.approved == [event_id]
    assert [e["event"] for e in logs] == ["preemption.acknowledged"]
    started = _source(azure_metadata, vm_name="gpu-vm-0").poll()
    assert started is not None and started.detail["event_status"] == "Started"


def test_fake_requires_the_metadata_header_and_api_version(
    azure_metadata: FakeAzureMetadata,
) -> None:
    def status(path: str, headers: dict[str, str]) -> int:
        conn = http.client.HTTPConnection(urlsplit(azure_metadata.url).netloc, timeout=5)
        try:
            conn.request("GET", path, headers=headers)
            resp = conn.getresponse()
            resp.read()
            return resp.status
        finally:
            conn.close()

    path = "/metadata/scheduledevents?api-version=2020-07-01"
    assert status(path, {}) == 400
    assert status(path, {"Metadata": "true", "X-Forwarded-For": "10.0.0.9"}) == 400
    assert status("/metadata/scheduledevents", {"Metadata": "true"}) == 400
    assert status(path, {"Metadata": "true"}) == 200


class _EditableAzureMetadata(FakeAzureMetadata):
    """The fake service, also able to set any field of an event to any JSON value."""

    def edit(self, event_id: str, **fields: object) -> None:
        self._change(lambda: self._events[event_id].update(fields))


@pytest.fixture
def odd_azure() -> Iterator[_EditableAzureMetadata]:
    fake = _EditableAzureMetadata().start()
    try:
        yield fake
    finally:
        fake.stop()


def test_unreadable_not_before_gets_the_default_deadline_and_is_logged(
    odd_azure: _EditableAzureMetadata,
) -> None:
    event_id = odd_azure.schedule("Preempt")
    odd_azure.edit(event_id, NotBefore="next Tuesday, around noon")
    src = _source(odd_azure)
    with capture_logs() as logs:
        notice, again = src.poll(), src.poll()
    assert notice is not None and again is not None
    left = notice.deadline_mono - time.monotonic()
    assert DEFAULT_DEADLINE_SECONDS - 5 < left <= DEFAULT_DEADLINE_SECONDS
    reported = [e for e in logs if e["event"] == "preemption.malformed_event"]
    assert [(e["event_id"], e["reason"]) for e in reported] == [(event_id, "unreadable_not_before")]


def test_past_not_before_is_now(odd_azure: _EditableAzureMetadata) -> None:
    past = datetime.now(UTC) - timedelta(minutes=5)
    odd_azure.schedule("Preempt", not_before=past)
    notice = _source(odd_azure).poll()
    assert notice is not None
    assert abs(notice.deadline - notice.received_at) < 0.5


def test_malformed_resources_skip_only_that_event(odd_azure: _EditableAzureMetadata) -> None:
    bad = [odd_azure.schedule("Terminate") for _ in range(3)]
    odd_azure.edit(bad[0], Resources=5)
    odd_azure.edit(bad[1], Resources={"gpu-vm-0": True})
    odd_azure.edit(bad[2], Resources="gpu-vm-0")
    later = datetime.now(UTC) + timedelta(seconds=60)
    good = odd_azure.schedule("Preempt", not_before=later)
    src = _source(odd_azure)
    with capture_logs() as logs:
        notice, again = src.poll(), src.poll()
    assert notice is not None and notice.event_id == f"azure:{good}"
    assert again is not None and again.event_id == notice.event_id
    reported = [e for e in logs if e["event"] == "preemption.malformed_event"]
    assert sorted(e["event_id"] for e in reported) == sorted(bad)  # once each
    assert {e["reason"] for e in reported} == {"malformed_resources"}
