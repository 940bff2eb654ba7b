"""The lower-priority lane: other files (logs, configs) uploaded one by one, no manifest.

A file whose key a live manifest names is never written over (committed objects are
immutable). With a ``root``, a file is read only when reached from it without a symlink on
the way (:mod:`sidecar.upload.beneath`). A vanished file is skipped; a failed upload is
handed to ``on_failure``. Uploads keep to the ``limiter``
(``upload.max_bandwidth_bytes_per_second``) and stop at the next block once ``stop`` is set.
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable
from pathlib import Path

import structlog

from sidecar.catalog import Catalog
from sidecar.metrics import Metrics
from sidecar.model import CheckpointReady
from sidecar.queue import CheckpointQueue
from sidecar.storage.base import Backend, Cancelled, StorageError
from sidecar.upload.bandwidth import BandwidthLimiter
from sidecar.upload.beneath import source_beneath
from sidecar.upload.retry import Backoff, retry

__all__ = ["OtherFilesLoop"]

log = structlog.get_logger("sidecar.other_files")


class OtherFilesLoop:
    def __init__(
        self,
        backend: Backend,
        queue: CheckpointQueue,
        catalog: Catalog,
        metrics: Metrics,
        backoff: Backoff,
        stop: threading.Event,
        on_failure: Callable[[CheckpointReady, Exception], None],
        *,
        root: Path | None = None,
        limiter: BandwidthLimiter | None = None,
    ) -> None:
        self.backend = backend
        self.root = root
        self.limiter = limiter
        self.queue = queue
        self.catalog = catalog
        self.metrics = metrics
        self.backoff = backoff
        self.stop = stop
        self.on_failure = on_failure

    def run(self) -> None:
        while not self.stop.is_set():
            item = self.queue.get_other()  # None once the queue is closed at stop
            if item is not None:
                self.upload(item)

    def _progress(self, n: int) -> None:
        """Under the same bandwidth cap as checkpoints; a stop cancels the upload."""
        if self.stop.is_set():
            raise Cancelled("stopping")
        if self.limiter is not None:
            self.limiter.consume(n)

    def upload(self, item: CheckpointReady) -> None:
        if self.catalog.names_key(item.name):
            log.warning(
                "other_file.skipped",
                path=item.name,
                reason="a committed checkpoint owns this key; it is never written over",
            )
            return
        f = item.files[0]
        try:
            with source_beneath(self.root, f.path) as (source, _):
                info = retry(
                    functools.partial(
                        self.backend.put_file, item.name, source, progress=self._progress
                    ),
                    self.backoff,
                    wait=self.stop.wait,
                )
        except FileNotFoundError:
            return
        except Cancelled:
            return
        except (StorageError, OSError) as e:
            self.on_failure(item, e)
            return
        self.metrics.bytes_uploaded.labels(self.backend.scheme, "ok").inc(info.size)
        self.metrics.files_uploaded.labels(self.backend.scheme, "ok").inc()
        log.debug("other_file.uploaded", path=item.name, bytes=info.size)
