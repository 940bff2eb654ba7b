"""Azure: Scheduled Events (``Preempt`` and ``Terminate``) that name this VM.

Every ``interval`` seconds: ``GET /metadata/scheduledevents?api-version=...`` with
``Metadata: true``. An event counts when its ``EventType`` is one of
``opts.event_types`` and its ``Resources`` contain this VM's name (``opts.vm_name``, else
``/metadata/instance/compute/name``, asked once). Deadline = ``NotBefore`` (RFC 1123), or
now when it is empty (the event has started) or past, or ``DEFAULT_DEADLINE_SECONDS`` from
now when it cannot be read (logged). An event of a watched type whose ``Resources`` is not a
list is skipped (logged) and the other events are still read. The first call may take up
to two minutes while the service starts on the VM, so it gets ``first_call_timeout_seconds``.
Events are never approved unless ``acknowledge: after_flush``, and then only through
:meth:`AzureScheduledEventsSource.acknowledge`, which the daemon calls after its flush.
"""

from __future__ import annotations

import json
import time
from typing import Any

import structlog

from sidecar.model import Notice
from sidecar.preemption.base import (
    MetadataHttp,
    Response,
    SourceError,
    make_notice,
    parse_rfc1123,
)
from sidecar.preemption.options import AzureMetadataOptions

__all__ = ["AzureScheduledEventsSource"]

EVENTS_PATH = "/metadata/scheduledevents"
NAME_PATH = "/metadata/instance/compute/name?api-version=2021-02-01&format=text"
HEADERS = {"Metadata": "true"}
DEFAULT_DEADLINE_SECONDS = 30.0
"""Deadline of an event whose ``NotBefore`` cannot be read: a Preempt's documented minimum
notice, the shortest Azure gives."""

log = structlog.get_logger()


class AzureScheduledEventsSource:
    """Polls Scheduled Events; see the module docstring."""

    name = "azure"

    def __init__(self, opts: AzureMetadataOptions) -> None:
        self.interval = opts.interval_seconds
        self._opts = opts
        self._http = MetadataHttp(opts.base_url, opts.timeout_seconds)
        self._events_path = f"{EVENTS_PATH}?api-version={opts.api_version}"
        self._vm_name = opts.vm_name
        self._first_call = True
        self._reported: set[tuple[str, str]] = set()

    def poll(self) -> Notice | None:
        vm = self._this_vm().casefold()
        timeout = self._opts.first_call_timeout_seconds if self._first_call else None
        resp = self._http.request("GET", self._events_path, dict(HEADERS), read_timeout=timeout)
        _check(resp, "scheduledevents")
        self._first_call = False
        doc = _json_object(resp.body)
        events = doc.get("Events")
        if not isinstance(events, list):
            raise SourceError("bad_response", f"scheduledevents: no Events list: {doc!r:.200}")
        incarnation = str(doc.get("DocumentIncarnation", ""))
        ours = [
            self._notice(ev, incarnation)
            for ev in events
            if isinstance(ev, dict)
            and ev.get("EventType") in self._opts.event_types
            and self._names(ev, vm)
        ]
        return min(ours, key=lambda n: n.deadline) if ours else None

    def acknowledge(self, notice: Notice) -> bool:
        """Approve the event (``StartRequests``) when ``acknowledge: after_flush`` and return
        ``True``; otherwise do nothing and return ``False``. Works after :meth:`close` (the
        daemon may stop polling before it acknowledges). Raises :class:`SourceError` when
        the approval fails."""
        if self._opts.acknowledge != "after_flush" or notice.source != self.name:
            return False
        body = json.dumps({"StartRequests": [{"EventId": notice.detail["event_id"]}]})
        headers = dict(HEADERS, **{"Content-Type": "application/json"})
        http = MetadataHttp(self._opts.base_url, self._opts.timeout_seconds)
        resp = http.request("POST", self._events_path, headers, body=body.encode())
        _check(resp, "scheduledevents approval")
        return True

    def close(self) -> None:
        self._http.close()

    def _this_vm(self) -> str:
        if self._vm_name is None:
            resp = self._http.request("GET", NAME_PATH, dict(HEADERS))
            _check(resp, "compute/name")
            name = resp.body.decode("utf-8", "replace").strip()
            if not name:
                raise SourceError("bad_response", "compute/name: empty VM name")
            self._vm_name = name
        return self._vm_name

    def _names(self, ev: dict[str, Any], vm: str) -> bool:
        """Whether the event's ``Resources`` name this VM; a malformed list names nothing."""
        resources = ev.get("Resources")
        if resources is None:
            return False
        if not isinstance(resources, list):
            self._report(ev, "malformed_resources", resources=f"{resources!r:.200}")
            return False
        return vm in (str(r).casefold() for r in resources)

    def _report(self, ev: dict[str, Any], reason: str, **fields: str) -> None:
        """Log what is odd about one event, once per event and reason."""
        key = (str(ev.get("EventId")), reason)
        if key not in self._reported:
            self._reported.add(key)
            log.warning(
                "preemption.malformed_event",
                source=self.name,
                event_id=key[0],
                reason=reason,
                **fields,
            )

    def _notice(self, ev: dict[str, Any], incarnation: str) -> Notice:
        not_before = str(ev.get("NotBefore") or "")
        now = time.time()
        if not not_before:
            deadline = now  # the event has started
        elif (at := parse_rfc1123(not_before)) is not None:
            deadline = max(at, now)
        else:
            deadline = now + DEFAULT_DEADLINE_SECONDS
            self._report(
                ev,
                "unreadable_not_before",
                not_before=f"{not_before:.200}",
                default_deadline_seconds=str(DEFAULT_DEADLINE_SECONDS),
            )
        event_type = str(ev.get("EventType"))
        return make_notice(
            "azure",
            event_type.lower(),
            f"azure:{ev.get('EventId')}",
            deadline=deadline,
            detail={
                "event_id": str(ev.get("EventId")),
                "event_type": event_type,
                "event_status": str(ev.get("EventStatus", "")),
                "not_before": not_before,
                "document_incarnation": incarnation,
            },
        )


def _check(resp: Response, what: str) -> None:
    if resp.status == 200:
        return
    fix = None
    if resp.status == 400:
        fix = "IMDS refused the request (missing 'Metadata: true' or a proxy in the path)"
    raise SourceError(f"http_{resp.status}", f"{what}: HTTP {resp.status}", fix=fix)


def _json_object(body: bytes) -> dict[str, Any]:
    try:
        doc = json.loads(body)
    except ValueError:
        doc = None
    if not isinstance(doc, dict):
        raise SourceError("bad_response", f"scheduledevents: not a JSON object: {body[:200]!r}")
    return doc
