"""The daemon: wires watcher -> queue -> committer (uploader pool) and owns the lifecycle.

Threads: the watcher, one commit loop (one checkpoint at a time, its files in parallel on
the pool), one loop for other files, the admin listener, the preemption poller. The main
thread waits for a stop and handles signals: SIGTERM/SIGINT drain then exit,
SIGUSR1 drains and keeps running. :meth:`Daemon.run` returns the exit status: 0, or 4 when
a drain ended with the newest complete checkpoint not durable.
"""

from __future__ import annotations

import functools
import os
import signal
import threading
import time
from dataclasses import dataclass, field
from typing import Any

import structlog

from sidecar import __version__
from sidecar.catalog import Catalog
from sidecar.commit import Committer
from sidecar.config import Config
from sidecar.drain import DrainController
from sidecar.metrics import Metrics
from sidecar.model import CheckpointReady, EntryKind, Notice
from sidecar.queue import CheckpointQueue
from sidecar.retention import Retention
from sidecar.state import StateCache
from sidecar.storage.base import (
    Backend,
    Cancelled,
    PermanentError,
    StorageError,
    TransientError,
)
from sidecar.upload.bandwidth import BandwidthLimiter
from sidecar.upload.pool import FileChanged, UploaderPool
from sidecar.upload.retry import Backoff, retry
from sidecar.watch.completion import CompletionTracker
from sidecar.watch.layouts import layout_for
from sidecar.watch.watcher import Watcher, choose_mode

__all__ = ["Daemon"]

log = structlog.get_logger("sidecar.app")
_RETRY_LATER_SECONDS = 5.0


@dataclass
class Health:
    """What /healthz and /readyz report."""

    watching: bool = False
    catalog_loaded: bool = False
    permanent_error: str | None = None
    errors_seen: set[str] = field(default_factory=set)


class Daemon:
    def __init__(self, cfg: Config, backend: Backend, metrics: Metrics | None = None) -> None:
        self.cfg = cfg
        self.backend = backend
        self.metrics = metrics or Metrics()
        self.metrics.build.info({"version": __version__, "backend": backend.scheme})
        self.stop_event = threading.Event()
        self.health = Health()
        self.catalog = Catalog()
        self.queue = CheckpointQueue(cfg.queue.max_checkpoints, cfg.queue.max_bytes)
        self.cache = StateCache(cfg.state_dir)
        self.backoff = Backoff(
            cfg.upload.max_attempts,
            cfg.upload.backoff_initial_seconds,
            cfg.upload.backoff_max_seconds,
        )
        self.limiter = BandwidthLimiter(cfg.upload.max_bandwidth_bytes_per_second)
        self.pool = UploaderPool(
            backend,
            self.cache,
            self.metrics,
            self.backoff,
            self.limiter,
            cfg.upload.concurrency,
            self.stop_event,
        )
        self.committer = Committer(
            backend,
            self.catalog,
            self.pool,
            self.cache,
            Retention(backend, cfg.retention.keep_last, cfg.retention.keep_every_steps),
            self.metrics,
            self.backoff,
            self.stop_event,
            on_committed=self._committed,
        )
        layout = layout_for(cfg.checkpoint.layout, cfg.checkpoint.pattern, cfg.checkpoint.marker)
        self.mode = choose_mode(cfg.watch.mode, cfg.watch.path)
        self._symlinks_logged: set[str] = set()
        tracker = CompletionTracker(
            cfg.watch.path.absolute(),
            layout,
            settle_seconds=cfg.watch.settle_seconds,
            step_regex=cfg.checkpoint.step_regex,
            other_files=cfg.other_files.enabled,
            other_interval_seconds=cfg.other_files.interval_seconds,
            poll_mode=self.mode == "poll",
            on_symlink=self._on_symlink,
        )
        self.watcher = Watcher(
            tracker,
            self._on_ready,
            mode=self.mode,
            poll_interval=cfg.watch.poll_interval_seconds,
        )
        self.lock = threading.Lock()
        self.current: CheckpointReady | None = None
        self.current_cancel = threading.Event()
        self.current_start_bytes = 0
        self.pending: dict[str, CheckpointReady] = {}  # ready, not yet durable
        self.drain = DrainController(self)
        self.metrics.unprotected.set_function(self.unprotected_seconds)
        self._threads: list[threading.Thread] = []

    # -- hand-offs ----------------------------------------------------------------------------
    def _on_symlink(self, path: Any) -> None:
        if str(path) not in self._symlinks_logged:
            self._symlinks_logged.add(str(path))
            log.warning(
                "watch.symlink_skipped",
                path=str(path),
                reason="symlinks are never followed; copy the file into the folder",
            )

    def _on_ready(self, item: CheckpointReady) -> None:
        if item.kind is EntryKind.CHECKPOINT:
            log.info(
                "checkpoint.ready",
                checkpoint=item.name,
                step=item.step,
                files=len(item.files),
                bytes=item.size,
            )
            with self.lock:
                self.pending[item.name] = item
        for old in self.queue.put(item):
            if old.completed_mono != item.completed_mono or old.name != item.name:
                self.metrics.superseded.inc()
                log.info("checkpoint.superseded", checkpoint=old.name, by=item.name)
        self.drain.on_ready(item)
        self._update_queue_metrics()

    def _update_queue_metrics(self) -> None:
        n, b, _ = self.queue.depth()
        self.metrics.queue_depth.set(n)
        self.metrics.queue_bytes.set(b)

    @property
    def last_committed(self) -> dict[str, Any] | None:
        """The newest committed checkpoint (by step, then commit sequence)."""
        m = self.catalog.newest()
        if m is None:
            return None
        return {
            "name": m.name,
            "step": m.step,
            "committed_at": m.committed_at,
            "generation": m.generation,
        }

    def unprotected_seconds(self) -> float:
        with self.lock:
            items = list(self.pending.values())
        if not items:
            return 0.0
        newest = max(items, key=lambda i: (i.step if i.step is not None else -1, i.completed_mono))
        return max(0.0, time.monotonic() - newest.completed_mono)

    # -- loops --------------------------------------------------------------------------------
    def _commit_loop(self) -> None:
        while not self.stop_event.is_set():
            item = self.queue.get_checkpoint(timeout=0.5)
            self._update_queue_metrics()
            if item is None:
                continue
            with self.lock:
                self.current, self.current_cancel = item, threading.Event()
                self.current_start_bytes = self.pool.meter.total
                cancel = self.current_cancel
            try:
                self.committer.commit(item, cancel)
            except Cancelled:
                if not self.stop_event.is_set():
                    log.info("checkpoint.cancelled", checkpoint=item.name)
            except FileChanged as e:
                log.info("checkpoint.changed", checkpoint=item.name, detail=str(e))
                self.watcher.retry_later(item.name)
            except FileNotFoundError as e:
                log.warning("checkpoint.vanished", checkpoint=item.name, path=e.filename)
                with self.lock:
                    self.pending.pop(item.name, None)
                self.watcher.retry_later(item.name)
            except (StorageError, OSError) as e:
                self._failed(item, "commit", e)
            finally:
                with self.lock:
                    self.current = None
                self.drain.after_item()

    def _committed(self, item: CheckpointReady) -> None:
        with self.lock:
            stale = [
                n
                for n, p in self.pending.items()
                if p.completed_mono <= item.completed_mono and (n == item.name or _older(p, item))
            ]
            for n in stale:
                self.pending.pop(n, None)
        if self.health.permanent_error:
            log.info("storage.recovered")
            self.health.permanent_error = None

    def _failed(self, item: CheckpointReady, op: str, err: Exception) -> None:
        kind = type(err).__name__
        self.metrics.errors.labels(op, kind).inc()
        if isinstance(err, PermanentError):
            msg = str(err)
            self.health.permanent_error = msg
            if msg not in self.health.errors_seen:
                self.health.errors_seen.add(msg)
                log.error(
                    "storage.permanent_error",
                    checkpoint=item.name,
                    error=msg,
                    action=f"kept queued; retried every {_RETRY_LATER_SECONDS:.0f} s",
                )
        else:
            log.warning(
                "checkpoint.upload_failed",
                checkpoint=item.name,
                error=str(err),
                kind=kind,
                action="retried later",
            )
        t = threading.Timer(_RETRY_LATER_SECONDS, self.watcher.retry_later, [item.name])
        t.daemon = True
        t.start()

    def _other_loop(self) -> None:
        while not self.stop_event.is_set():
            item = self.queue.get_other(timeout=0.5)
            if item is None:
                continue
            f = item.files[0]
            if self.catalog.names_key(item.name):
                log.warning(
                    "other_file.skipped",
                    path=item.name,
                    reason="a committed checkpoint owns this key; it is never written over",
                )
                continue
            try:
                info = retry(
                    functools.partial(self.backend.put_file, item.name, f.path),
                    self.backoff,
                    wait=self.stop_event.wait,
                )
                self.metrics.bytes_uploaded.labels(self.backend.scheme, "ok").inc(info.size)
                self.metrics.files_uploaded.labels(self.backend.scheme, "ok").inc()
                log.debug("other_file.uploaded", path=item.name, bytes=info.size)
            except FileNotFoundError:
                continue
            except (StorageError, OSError) as e:
                if not isinstance(e, Cancelled):
                    self._failed(item, "other_file", e)

    # -- lifecycle ----------------------------------------------------------------------------
    def _load_catalog(self) -> bool:
        def invalid(key: str, reason: str) -> None:
            log.warning("catalog.manifest_invalid", manifest=key, reason=reason)

        while not self.stop_event.is_set():
            try:
                loaded = retry(
                    lambda: Catalog.load(self.backend, invalid),
                    self.backoff,
                    wait=self.stop_event.wait,
                )
            except PermanentError as e:
                self.health.permanent_error = str(e)
                log.error("storage.permanent_error", operation="list manifests", error=str(e))
                self.stop_event.wait(_RETRY_LATER_SECONDS)
                continue
            except TransientError as e:
                log.warning("storage.unavailable", operation="list manifests", error=str(e))
                continue
            for m in loaded.all():
                self.catalog.add(m)
            self.catalog.add_sequence_floor(loaded.next_sequence() - 1)
            newest = self.catalog.newest()
            if newest is not None and newest.step is not None:
                self.metrics.last_step.set(newest.step)
            self.health.catalog_loaded = True
            log.info("catalog.loaded", checkpoints=len(loaded.all()))
            return True
        return False

    def _start_thread(self, name: str, target: Any) -> None:
        t = threading.Thread(target=target, name=name, daemon=True)
        t.start()
        self._threads.append(t)

    def start(self) -> None:
        """Start every stage; returns once the watcher runs."""
        cfg = self.cfg
        log.info(
            "daemon.starting",
            version=__version__,
            watch=str(cfg.watch.path.absolute()),
            destination=self.backend.url,
            mode=self.mode,
            layout=cfg.checkpoint.layout,
        )
        try:
            removed = self.backend.cleanup_stale(cfg.upload.stale_multipart_hours * 3600)
            if removed:
                log.info("storage.stale_uploads_removed", count=removed)
        except StorageError as e:
            log.warning("storage.cleanup_failed", error=str(e))
        if not self._load_catalog():
            return
        self.watcher.start()
        self.health.watching = True
        self._start_thread("commit", self._commit_loop)
        self._start_thread("other-files", self._other_loop)
        log.info("daemon.ready", watch=str(cfg.watch.path.absolute()), destination=self.backend.url)

    def notice(self, notice: Notice, *, exit_after: bool) -> None:
        """A termination notice (any source); starts a drain. Thread-safe."""
        self.drain.start(notice, exit_after=exit_after)

    def install_signal_handlers(self) -> None:
        def on_term(signum: int, frame: Any) -> None:
            now, mono = time.time(), time.monotonic()
            grace = self.cfg.shutdown_grace_seconds
            kind = "terminate" if signum == signal.SIGTERM else "interrupt"
            n = Notice(
                "signal",
                kind,
                now + grace,
                now,
                mono + grace,
                event_id=f"signal-{signum}-{int(now)}",
            )
            threading.Thread(
                target=self.notice, args=(n,), kwargs={"exit_after": True}, daemon=True
            ).start()

        def on_usr1(signum: int, frame: Any) -> None:
            now, mono = time.time(), time.monotonic()
            grace = self.cfg.shutdown_grace_seconds
            n = Notice(
                "signal", "usr1", now + grace, now, mono + grace, event_id=f"signal-usr1-{int(now)}"
            )
            threading.Thread(
                target=self.notice, args=(n,), kwargs={"exit_after": False}, daemon=True
            ).start()

        signal.signal(signal.SIGTERM, on_term)
        signal.signal(signal.SIGINT, on_term)
        signal.signal(signal.SIGUSR1, on_usr1)

    def run(self) -> int:
        """Run until stopped (install signal handlers first); the exit status."""
        self.start()
        while not self.stop_event.wait(0.5):
            pass
        return self.shutdown()

    def shutdown(self) -> int:
        self.stop_event.set()
        self.queue.close()
        self.watcher.stop()
        for t in self._threads:
            t.join(timeout=5)
        self.pool.close()
        self.cache.save()
        self.backend.close()
        code = self.drain.exit_code
        log.info("daemon.stopped", exit_code=code)
        return code

    def request_stop(self) -> None:
        self.stop_event.set()


def _older(p: CheckpointReady, than: CheckpointReady) -> bool:
    a = (p.step if p.step is not None else -1, p.completed_mono)
    b = (than.step if than.step is not None else -1, than.completed_mono)
    return a < b


def pid_from_file(path: os.PathLike[str] | str) -> int | None:
    try:
        return int(open(path, encoding="utf-8").read().strip())
    except (OSError, ValueError):
        return None
