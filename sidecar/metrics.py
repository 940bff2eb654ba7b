"""Every Prometheus metric the daemon exports, on an injectable registry.

Labels are bounded: backend, result, operation, kind, source, outcome. Never a file
name or a step.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, Info

__all__ = ["Metrics"]

_BYTES_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600, 1800)


class Metrics:
    """The daemon's metrics; tests pass a fresh ``CollectorRegistry()``."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        r = registry if registry is not None else CollectorRegistry()
        self.registry = r
        p = "ckpt_sidecar_"
        self.bytes_uploaded = Counter(
            p + "uploaded_bytes", "Bytes uploaded", ["backend", "result"], registry=r
        )
        self.files_uploaded = Counter(
            p + "uploaded_files", "Files uploaded", ["backend", "result"], registry=r
        )
        self.bytes_copied = Counter(
            p + "server_side_copy_saved_bytes",
            "Bytes not uploaded because an unchanged file was copied server-side",
            registry=r,
        )
        self.upload_seconds = Histogram(
            p + "upload_duration_seconds",
            "Upload time per file",
            buckets=_BYTES_BUCKETS,
            registry=r,
        )
        self.commit_latency = Histogram(
            p + "commit_latency_seconds",
            "From checkpoint complete to manifest written",
            buckets=_BYTES_BUCKETS,
            registry=r,
        )
        self.queue_depth = Gauge(p + "queue_checkpoints", "Checkpoints waiting", registry=r)
        self.queue_bytes = Gauge(p + "queue_bytes", "Bytes of checkpoints waiting", registry=r)
        self.in_flight_bytes = Gauge(p + "in_flight_bytes", "Bytes of uploads running", registry=r)
        self.last_step = Gauge(p + "last_committed_step", "Step of the newest commit", registry=r)
        self.last_commit_time = Gauge(
            p + "last_commit_timestamp_seconds", "Wall time of the newest commit", registry=r
        )
        self.unprotected = Gauge(
            p + "unprotected_seconds",
            "Age of the newest complete local checkpoint not yet durable (0 when all committed)",
            registry=r,
        )
        self.retries = Counter(
            p + "retries", "Retried operations", ["operation", "kind"], registry=r
        )
        self.errors = Counter(p + "errors", "Errors", ["operation", "kind"], registry=r)
        self.superseded = Counter(
            p + "checkpoints_superseded", "Checkpoints dropped for a newer one", registry=r
        )
        self.orphans_deleted = Counter(
            p + "orphans_deleted",
            "Objects of checkpoint names no manifest names, deleted by the sweep once old",
            registry=r,
        )
        self.committed = Counter(p + "checkpoints_committed", "Checkpoints committed", registry=r)
        self.conflicts = Counter(
            p + "manifest_conflicts",
            "Create-only manifest writes that met other content",
            registry=r,
        )
        self.notices = Counter(p + "notices", "Termination notices", ["source", "kind"], registry=r)
        self.drains = Counter(p + "drains", "Drains by outcome", ["outcome"], registry=r)
        for outcome in ("committed", "missed"):  # at 0 from the start: increase() sees the 1st
            self.drains.labels(outcome)
        self.drain_seconds = Histogram(
            p + "drain_duration_seconds", "Drain duration", buckets=_BYTES_BUCKETS, registry=r
        )
        self.deadline_remaining = Gauge(
            p + "notice_deadline_remaining_seconds",
            "Seconds left before the notice deadline while a drain waits (0 otherwise)",
            registry=r,
        )
        self.build = Info(p + "build", "Version and backend", registry=r)
