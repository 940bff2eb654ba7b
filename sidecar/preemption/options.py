"""Per-source options (`preemption.aws.*`, `preemption.gcp.*`, `preemption.azure.*`).

Endpoints left unset follow each cloud's own override, read from the environment when the
sources are built (:func:`sidecar.preemption.sources.build_sources`):
``AWS_EC2_METADATA_SERVICE_ENDPOINT`` (and ``AWS_EC2_METADATA_SERVICE_ENDPOINT_MODE=IPv6``)
as botocore reads them, ``GCE_METADATA_HOST`` as the Google clients read it. Azure has no
such variable; ``preemption.azure.base_url`` is the override.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

__all__ = [
    "AZURE_EVENT_TYPES",
    "AwsMetadataOptions",
    "AzureMetadataOptions",
    "GcpMetadataOptions",
]

AZURE_EVENT_TYPES = ("Freeze", "Reboot", "Redeploy", "Preempt", "Terminate")
"""The ``EventType`` values Azure Scheduled Events documents; Azure sends them spelt so."""


class _Options(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)


class AwsMetadataOptions(_Options):
    """EC2 instance metadata (IMDSv2): spot interruption and rebalance recommendation."""

    endpoint: str | None = None
    """Base URL such as ``http://169.254.169.254``; unset: the environment, then the default."""
    interval_seconds: float = Field(default=1.0, gt=0, le=60)
    timeout_seconds: float = Field(default=1.0, gt=0, le=30)
    """Per request; also how long a token PUT may hang (hop limit 1 in a container)."""
    token_ttl_seconds: int = Field(default=21600, ge=1, le=21600)
    rebalance: bool = True
    """Report rebalance recommendations as early warnings (``drain=False``)."""
    rebalance_horizon_seconds: float = Field(default=120.0, gt=0, le=86400)
    """Deadline given to a rebalance warning: a planning horizon, not a promise by AWS."""
    default_deadline_seconds: float = Field(default=120.0, gt=0, le=86400)
    """Used when an instance-action carries no readable ``time`` (AWS gives two minutes)."""


class GcpMetadataOptions(_Options):
    """Compute Engine metadata: ``instance/preempted`` and ``instance/maintenance-event``."""

    host: str | None = None
    """``host[:port]`` of the metadata server; unset: ``GCE_METADATA_HOST``, then
    ``metadata.google.internal``."""
    wait_timeout_seconds: int = Field(default=60, ge=1, le=3600)
    """``timeout_sec`` of each hanging ``wait_for_change`` request."""
    timeout_seconds: float = Field(default=2.0, gt=0, le=30)
    """Connect timeout, and the read timeout beyond ``wait_timeout_seconds``."""
    preempt_deadline_seconds: float = Field(default=30.0, gt=0, le=86400)
    maintenance: bool = True
    """Treat ``maintenance-event`` = ``TERMINATE_ON_HOST_MAINTENANCE`` as a notice."""
    maintenance_deadline_seconds: float = Field(default=60.0, gt=0, le=86400)


class AzureMetadataOptions(_Options):
    """Azure Instance Metadata Service: Scheduled Events for this VM."""

    base_url: str = "http://169.254.169.254"
    api_version: str = "2020-07-01"
    interval_seconds: float = Field(default=1.0, gt=0, le=60)
    timeout_seconds: float = Field(default=2.0, gt=0, le=60)
    first_call_timeout_seconds: float = Field(default=120.0, gt=0, le=600)
    """The first Scheduled Events call may take up to two minutes while the service starts."""
    vm_name: str | None = None
    """This VM's name as it appears in ``Resources``; unset: ``compute/name`` from IMDS."""
    event_types: tuple[str, ...] = ("Preempt", "Terminate")
    """Event types that start a drain; each one of :data:`AZURE_EVENT_TYPES`, in any case."""
    acknowledge: Literal["never", "after_flush"] = "never"
    """``after_flush`` approves the event (``StartRequests``) once the flush is done; approving
    a Preempt earlier would only shorten the window."""

    @field_validator("event_types")
    @classmethod
    def _known_event_types(cls, v: tuple[str, ...]) -> tuple[str, ...]:
        """A typo (``Preemt``) would silently match no event, so only the documented types
        pass, stored as Azure spells them (the source compares them exactly)."""
        by_fold = {t.casefold(): t for t in AZURE_EVENT_TYPES}
        allowed = ", ".join(AZURE_EVENT_TYPES)
        unknown = [t for t in v if t.strip().casefold() not in by_fold]
        if unknown:
            raise ValueError(
                f"unknown Azure Scheduled Events type {', '.join(map(repr, unknown))}; "
                f"allowed: {allowed}"
            )
        if not v:
            raise ValueError(
                f"needs at least one of {allowed}; to ignore Azure notices set "
                "preemption.source to something other than azure"
            )
        return tuple(dict.fromkeys(by_fold[t.strip().casefold()] for t in v))
