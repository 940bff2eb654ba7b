"""GCP: ``instance/preempted`` and ``instance/maintenance-event``, long-polled.

Each watched value is one :class:`GcpMetadataWatch`. The first poll reads the value and its
``ETag``; every later poll is a hanging ``?wait_for_change=true&last_etag=E&timeout_sec=T``
that the metadata server answers the moment the value changes (or after ``T`` seconds with
the same value), so a notice arrives at once. Requests carry ``Metadata-Flavor: Google``
(without it the server answers 403), and an answer that lacks that header did not come from
the metadata server and is refused.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from urllib.parse import urlencode

from sidecar.model import Notice
from sidecar.preemption.base import MetadataHttp, SourceError, make_notice
from sidecar.preemption.options import GcpMetadataOptions

__all__ = ["GcpMetadataWatch", "endpoint_from", "maintenance_watch", "preempted_watch"]

DEFAULT_HOST = "metadata.google.internal"
FLAVOR = {"Metadata-Flavor": "Google"}
FORBIDDEN_FIX = (
    "the metadata server refuses requests without 'Metadata-Flavor: Google' or with "
    "'X-Forwarded-For': do not route metadata requests through a proxy"
)


def endpoint_from(opts: GcpMetadataOptions, env: Mapping[str, str]) -> str:
    """The metadata base URL: the option, else ``GCE_METADATA_HOST`` as Google's clients
    read it (``host[:port]``; the older ``GCE_METADATA_ROOT`` too), else the default."""
    host = opts.host or env.get("GCE_METADATA_HOST") or env.get("GCE_METADATA_ROOT")
    host = host or DEFAULT_HOST
    return host if "://" in host else f"http://{host}"


class GcpMetadataWatch:
    """One metadata value, long-polled (``interval`` 0: :meth:`poll` blocks by itself).

    ``is_notice(value)`` decides whether the current value is a notice of ``kind`` with
    ``deadline_seconds`` from its receipt."""

    name = "gcp"
    interval = 0.0

    def __init__(
        self,
        opts: GcpMetadataOptions,
        endpoint: str,
        key: str,
        *,
        kind: str,
        deadline_seconds: float,
        is_notice: Callable[[str], bool],
    ) -> None:
        self.key = key
        self.label = f"gcp:{key.removeprefix('instance/')}"
        self._opts = opts
        self._kind = kind
        self._deadline_seconds = deadline_seconds
        self._is_notice = is_notice
        self._http = MetadataHttp(endpoint, opts.timeout_seconds)
        self._etag: str | None = None

    def poll(self) -> Notice | None:
        path = f"/computeMetadata/v1/{self.key}"
        read_timeout = None
        if self._etag is not None:
            wait = self._opts.wait_timeout_seconds
            query = {"wait_for_change": "true", "last_etag": self._etag, "timeout_sec": wait}
            path += "?" + urlencode(query)
            read_timeout = wait + self._opts.timeout_seconds
        resp = self._http.request("GET", path, dict(FLAVOR), read_timeout=read_timeout)
        if resp.status != 200:
            fix = FORBIDDEN_FIX if resp.status == 403 else None
            raise SourceError(f"http_{resp.status}", f"GET {self.key}: HTTP {resp.status}", fix=fix)
        if resp.headers.get("Metadata-Flavor") != "Google":
            raise SourceError(
                "not_metadata_server",
                f"GET {self._http.base_url}/{self.key}: answer without 'Metadata-Flavor: Google'",
                fix="check GCE_METADATA_HOST / preemption.gcp.host",
            )
        etag = resp.headers.get("ETag")
        if not etag:
            raise SourceError("bad_response", f"GET {self.key}: no ETag in the answer")
        self._etag = etag
        value = resp.body.decode("utf-8", "replace").strip()
        if not self._is_notice(value):
            return None
        return make_notice(
            "gcp",
            self._kind,
            f"gcp:{self.key}:{value}:{etag}",
            seconds_left=self._deadline_seconds,
            detail={"key": self.key, "value": value},
        )

    def acknowledge(self, notice: Notice) -> bool:
        """Nothing to acknowledge on GCP."""
        return False

    def close(self) -> None:
        self._http.close()


def preempted_watch(opts: GcpMetadataOptions, endpoint: str) -> GcpMetadataWatch:
    """``instance/preempted`` = ``TRUE``: a spot or preemptible VM is being stopped."""
    return GcpMetadataWatch(
        opts,
        endpoint,
        "instance/preempted",
        kind="preempt",
        deadline_seconds=opts.preempt_deadline_seconds,
        is_notice=lambda v: v.upper() == "TRUE",
    )


def maintenance_watch(opts: GcpMetadataOptions, endpoint: str) -> GcpMetadataWatch:
    """``instance/maintenance-event`` = ``TERMINATE_ON_HOST_MAINTENANCE`` (GPU VMs cannot
    live-migrate; the value changes about 60 s before the host maintenance)."""
    return GcpMetadataWatch(
        opts,
        endpoint,
        "instance/maintenance-event",
        kind="terminate",
        deadline_seconds=opts.maintenance_deadline_seconds,
        is_notice=lambda v: v.upper().startswith("TERMINATE"),
    )
