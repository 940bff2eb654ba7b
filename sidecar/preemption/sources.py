"""Build the notice sources that ``preemption.*`` asks for.

``preemption.source``: ``aws``, ``gcp`` or ``azure`` runs that cloud's source(s); ``auto``
picks the cloud from DMI (:func:`~sidecar.preemption.detect.detect_cloud`), none when DMI
names no cloud; ``none`` runs no cloud source. ``preemption.trigger_file``, when set, adds
the trigger-file source in every case. Signals and ``POST /v1/drain`` are the daemon's.

Endpoint overrides are read from ``env`` (default: ``os.environ``) here, once.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING

import structlog

from sidecar.preemption import aws, gcp
from sidecar.preemption.azure import AzureScheduledEventsSource
from sidecar.preemption.base import Source
from sidecar.preemption.detect import DMI_DIR, detect_cloud
from sidecar.preemption.trigger import TriggerFileSource

if TYPE_CHECKING:
    from sidecar.config import PreemptionConfig

__all__ = ["build_sources"]

log = structlog.get_logger()


def build_sources(
    cfg: PreemptionConfig,
    *,
    env: Mapping[str, str] | None = None,
    dmi_dir: Path = DMI_DIR,
    trigger_deadline_seconds: float = 30.0,
) -> list[Source]:
    """The sources to hand to :class:`~sidecar.preemption.poller.Poller`, in priority order.

    ``trigger_deadline_seconds`` is the deadline of a trigger file that names none (the
    daemon passes ``shutdown_grace_seconds``). Raises ``ValueError`` for an endpoint that is
    not ``http://host[:port]``."""
    env = os.environ if env is None else env
    cloud = detect_cloud(dmi_dir) if cfg.source == "auto" else cfg.source
    sources: list[Source] = []
    if cloud == "aws":
        sources.append(aws.AwsSpotSource(cfg.aws, aws.endpoint_from(cfg.aws, env)))
    elif cloud == "gcp":
        endpoint = gcp.endpoint_from(cfg.gcp, env)
        sources.append(gcp.preempted_watch(cfg.gcp, endpoint))
        if cfg.gcp.maintenance:
            sources.append(gcp.maintenance_watch(cfg.gcp, endpoint))
    elif cloud == "azure":
        sources.append(AzureScheduledEventsSource(cfg.azure))
    if cfg.trigger_file is not None:
        sources.append(
            TriggerFileSource(cfg.trigger_file, default_deadline_seconds=trigger_deadline_seconds)
        )
    log.info(
        "preemption.sources",
        requested=cfg.source,
        cloud=cloud if cloud != "none" else None,
        sources=[s.name for s in sources],
    )
    return sources
