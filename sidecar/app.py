"""The daemon: wires watcher -> queue -> committer (uploader pool) and owns the lifecycle.

Threads: start-up (the store calls before watching), the watcher, one commit loop (one
checkpoint at a time, its files in parallel on the pool), one loop for other files, the
admin listener, the preemption poller. The main thread waits for a stop and handles
signals: SIGTERM/SIGINT drain then exit, SIGUSR1 drains and keeps running.
:meth:`Daemon.run` returns the exit status: 0, or 4 when a drain ended with the newest
complete checkpoint not durable.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import structlog

from sidecar import __version__
from sidecar.catalog import Catalog
from sidecar.commit import Committer
from sidecar.config import Config
from sidecar.drain import DrainController, clear_stale_notice
from sidecar.main_wait import MainWait
from sidecar.metrics import Metrics
from sidecar.model import CheckpointReady, EntryKind, Notice
from sidecar.orphans import OrphanSweeper
from sidecar.preemption import signals
from sidecar.preemption.base import Source
from sidecar.preemption.poller import Poller
from sidecar.queue import CheckpointQueue
from sidecar.retention import Retention
from sidecar.state import StateCache
from sidecar.storage.base import (
    Backend,
    Cancelled,
    DestinationRejected,
    PermanentError,
    StorageError,
    TransientError,
)
from sidecar.unprotected import Unprotected
from sidecar.upload.bandwidth import BandwidthLimiter
from sidecar.upload.others import OtherFilesLoop
from sidecar.upload.pool import FileChanged, UploaderPool
from sidecar.upload.retry import Backoff, retry
from sidecar.watch.completion import CompletionTracker
from sidecar.watch.layouts import layout_for
from sidecar.watch.watcher import Watcher, choose_mode

__all__ = ["Daemon"]

log = structlog.get_logger("sidecar.app")
_RETRY_LATER_SECONDS = 5.0
_QUIET_BEFORE_SWEEP_SECONDS = 0.5  # no work this long: the orphan sweep may run


@dataclass
class Health:
    """What /healthz and /readyz report."""

    watching: bool = False
    catalog_loaded: bool = False
    permanent_error: str | None = None
    errors_seen: set[str] = field(default_factory=set)


class Daemon:
    def __init__(
        self,
        cfg: Config,
        backend: Backend,
        metrics: Metrics | None = None,
        sources: Sequence[Source] = (),
    ) -> None:
        self.cfg = cfg
        self.backend = backend
        self.metrics = metrics or Metrics()
        self.metrics.build.info({"version": __version__, "backend": backend.scheme})
        self.stop_event = threading.Event()
        self._main_wait = MainWait()  # the main thread's sleep in run(); signals wake it
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
            root=cfg.watch.path.absolute(),
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
        self.sweeper = OrphanSweeper(
            backend, layout, self.metrics, cfg.retention.orphan_sweep_hours
        )
        self.mode = choose_mode(cfg.watch.mode, cfg.watch.path)
        self._warned: set[tuple[str, str]] = set()
        tracker = CompletionTracker(
            cfg.watch.path.absolute(),
            layout,
            settle_seconds=cfg.watch.settle_seconds,
            step_regex=cfg.checkpoint.step_regex,
            other_files=cfg.other_files.enabled,
            other_interval_seconds=cfg.other_files.interval_seconds,
            poll_mode=self.mode == "poll",
            on_symlink=self._on_symlink,
            on_skip=self._on_skip,
            on_unreadable=self._on_unreadable,
        )
        self.watcher = Watcher(
            tracker,
            self._on_ready,
            mode=self.mode,
            poll_interval=cfg.watch.poll_interval_seconds,
        )
        self.lock = threading.Lock()
        self._lifecycle = threading.Lock()  # start()'s stages vs shutdown()
        self._start_error: BaseException | None = None
        self.current: CheckpointReady | None = None
        self.current_cancel = threading.Event()
        self.current_start_bytes = 0
        self.pending = Unprotected()
        self.drain = DrainController(self)
        self.metrics.unprotected.set_function(self.unprotected_seconds)
        # read when scraped: set from the threads that change the queue, two such sets could
        # land out of order and leave a stale depth until the next change
        self.metrics.queue_depth.set_function(lambda: self.queue.depth()[0])
        self.metrics.queue_bytes.set_function(lambda: self.queue.depth()[1])
        self._threads: list[threading.Thread] = []
        self.poller = Poller(
            list(sources),
            on_notice=self._on_notice,
            on_error=lambda source, kind: self.metrics.errors.labels("preemption", kind).inc(),
        )

    # -- hand-offs ----------------------------------------------------------------------------
    def _warn_once(self, event: str, path: str, reason: str) -> None:
        """Log a skipped path once per daemon run, however often the scans meet it."""
        if (event, path) not in self._warned:
            self._warned.add((event, path))
            log.warning(event, path=path, reason=reason)

    def _on_symlink(self, path: Any) -> None:
        self._warn_once(
            "watch.symlink_skipped",
            str(path),
            "symlinks are never followed; copy the file into the folder",
        )

    def _on_unreadable(self, path: Path, reason: str) -> None:
        """Counted at every look (every few seconds), logged once."""
        self.metrics.errors.labels("watch", "PermissionError").inc()
        self._warn_once("watch.unreadable", str(path), reason)

    def _on_skip(self, path: Path, reason: str) -> None:
        self._warn_once("watch.name_skipped", repr(str(path)), reason)

    def _on_ready(self, item: CheckpointReady) -> None:
        if item.kind is EntryKind.CHECKPOINT and (known := self.committer.known_committed(item)):
            # Found again (start-up scan, retry): settled here, so it never queues or
            # supersedes anything.
            log.info(
                "checkpoint.already_committed",
                checkpoint=item.name,
                generation=known.generation,
                checked="checksum cache",
            )
            return
        if item.kind is EntryKind.CHECKPOINT:
            log.info(
                "checkpoint.ready",
                checkpoint=item.name,
                step=item.step,
                files=len(item.files),
                bytes=item.size,
            )
            self.pending.add(item)
        for old in self.queue.put(item):
            if old.completed_mono != item.completed_mono or old.name != item.name:
                self.metrics.superseded.inc()
                log.info("checkpoint.superseded", checkpoint=old.name, by=item.name)
        self.drain.on_ready(item)

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
        return self.pending.seconds()

    # -- loops --------------------------------------------------------------------------------
    def _commit_loop(self) -> None:
        # Wakes for work, for the orphan sweep when it is due (after a quiet spell, so the
        # start-up scan's checkpoints go first), and at stop (queue.close()); no polling: at
        # rest a wake-up is the daemon's whole cost (bench/idle.md).
        while not self.stop_event.is_set():
            due = self.sweeper.due_in()
            timeout = None if due is None else max(due, _QUIET_BEFORE_SWEEP_SECONDS)
            item = self.queue.get_checkpoint(timeout=timeout)
            if item is None:
                if not self.stop_event.is_set():
                    self.sweeper.maybe(abort=self._busy)
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
                self.pending.vanished(item)
                self.watcher.retry_later(item.name)
            except (StorageError, OSError) as e:
                self._failed(item, "commit", e)
            except Exception as e:  # a bug must not stop uploads: log it, retry the checkpoint
                log.exception("checkpoint.unexpected_error", checkpoint=item.name)
                self._failed(item, "commit", e)
            finally:
                with self.lock:
                    self.current = None
                if self.queue.depth()[0] == 0:  # a flush's uncapped run is over
                    self.limiter.work_done()
                self.drain.after_item()

    def _busy(self) -> bool:
        """New work, a drain or a stop: background chores (the orphan sweep) give way."""
        return (
            self.stop_event.is_set() or self.queue.depth()[0] > 0 or self.drain.state != "running"
        )

    def _committed(self, item: CheckpointReady) -> None:
        self.pending.committed(item)
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

    def _load_catalog(self) -> bool:
        def invalid(key: str, reason: str) -> None:
            log.warning("catalog.manifest_invalid", manifest=key, reason=reason)

        while not self.stop_event.is_set():
            try:
                retry(
                    lambda: self.catalog.fill_from(self.backend, invalid),
                    self.backoff,
                    wait=self.stop_event.wait,
                )
            except PermanentError as e:
                self.health.permanent_error = msg = str(e)
                self.metrics.errors.labels("list_manifests", type(e).__name__).inc()
                if msg not in self.health.errors_seen:  # once per message; /readyz shows it
                    self.health.errors_seen.add(msg)
                    log.error(
                        "storage.permanent_error",
                        operation="list manifests",
                        error=msg,
                        action=f"retried every {_RETRY_LATER_SECONDS:.0f} s",
                    )
                self.stop_event.wait(_RETRY_LATER_SECONDS)
                continue
            except TransientError as e:
                log.warning("storage.unavailable", operation="list manifests", error=str(e))
                continue
            if self.health.permanent_error:
                log.info("storage.recovered", operation="list manifests")
                self.health.permanent_error = None
            newest = self.catalog.newest()
            if newest is not None and newest.step is not None:
                self.metrics.last_step.set(newest.step)
            times = [t for m in self.catalog.all() if (t := m.committed_ts()) is not None]
            if times:  # as after a commit: a restart must not read as "never committed"
                self.metrics.last_commit_time.set(max(times))
            self.health.catalog_loaded = True
            log.info("catalog.loaded", checkpoints=len(self.catalog.all()))
            return True
        return False

    def dead_threads(self) -> list[str]:
        """Threads that should run but do not (for /healthz); empty before start and at stop."""
        if self.stop_event.is_set() or not self.health.watching:
            return []
        dead = [t.name for t in self._threads if not t.is_alive()]
        if not self.watcher.alive:
            dead.append("watcher")
        return dead + self.poller.dead_threads()

    def _start_thread(self, name: str, target: Any) -> None:
        t = threading.Thread(target=target, name=name, daemon=True)
        t.start()
        self._threads.append(t)

    def start(self) -> None:
        """Start every stage; returns once the watcher runs, or early once a stop is asked.

        The preemption poller starts first, so a notice during a slow start-up still tells
        the trainer. The store calls (check, stale-upload cleanup, catalog) run without the
        lifecycle lock, so :meth:`shutdown` never waits for them; the stages start under it,
        so a shutdown either sees them started or they never start.
        Raises :class:`DestinationRejected` from the destination check."""
        cfg = self.cfg
        log.info(
            "daemon.starting",
            version=__version__,
            watch=str(cfg.watch.path.absolute()),
            destination=self.backend.url,
            mode=self.mode,
            layout=cfg.checkpoint.layout,
        )
        clear_stale_notice(cfg.watch.path)
        with self._lifecycle:
            if self.stop_event.is_set():
                return
            self.poller.start()
        self._check_destination()
        try:
            removed = self.backend.cleanup_stale(cfg.upload.stale_multipart_hours * 3600)
            if removed:
                log.info("storage.stale_uploads_removed", count=removed)
        except StorageError as e:
            log.warning("storage.cleanup_failed", error=str(e))
        if not self._load_catalog():
            return
        with self._lifecycle:
            if self.stop_event.is_set():
                return
            self.watcher.start()
            self.health.watching = True
            self._start_thread("commit", self._commit_loop)
            others = OtherFilesLoop(
                self.backend,
                self.queue,
                self.catalog,
                self.metrics,
                self.backoff,
                self.stop_event,
                on_failure=lambda item, e: self._failed(item, "other_file", e),
                root=cfg.watch.path.absolute(),
                limiter=self.limiter,
            )
            self._start_thread("other-files", others.run)
        log.info("daemon.ready", watch=str(cfg.watch.path.absolute()), destination=self.backend.url)

    def _check_destination(self) -> None:
        """Log what the destination check finds; only a rejection (``allowed_regions``)
        stops start-up. An unreachable or refusing store is retried by the catalog load."""
        try:
            self.backend.check()
        except DestinationRejected:
            raise
        except PermanentError as e:
            log.error("storage.permanent_error", operation="check destination", error=str(e))
        except StorageError as e:
            log.warning("storage.unavailable", operation="check destination", error=str(e))

    def _on_notice(self, notice: Notice) -> None:
        """From a cloud or trigger-file source: drain on its own thread, keep running (the
        machine ends at the deadline; anything written meanwhile still goes up)."""
        threading.Thread(
            target=self._drain_then_ack, args=(notice,), name="drain", daemon=True
        ).start()

    def _drain_then_ack(self, notice: Notice) -> None:
        self.notice(notice, exit_after=False)
        if notice.drain and self.drain.exit_code == 0:
            self.poller.acknowledge(notice)

    def notice(self, notice: Notice, *, exit_after: bool) -> None:
        """A termination notice (any source); starts a drain. Thread-safe."""
        self.drain.start(notice, exit_after=exit_after)

    def install_signal_handlers(self) -> None:
        """SIGTERM/SIGINT: drain then exit; SIGUSR1: drain and keep running. Main thread."""
        signals.install(
            lambda n, exit_after: self.notice(n, exit_after=exit_after),
            self.cfg.shutdown_grace_seconds,
        )
        self._main_wait.install()

    def run(self) -> int:
        """Run until stopped (install signal handlers first); the exit status.

        Start-up runs on its own thread: a store that does not answer holds only that
        thread, so a signal still drains and the process exits within the grace period.
        Re-raises what start-up raised (:class:`DestinationRejected`, a bug) once stopped."""
        starter = threading.Thread(target=self._start_or_stop, name="startup", daemon=True)
        starter.start()
        self._main_wait.wait(self.stop_event)
        if self._start_error is not None:
            self._stop_stages()
            raise self._start_error
        return self.shutdown()

    def _start_or_stop(self) -> None:
        try:
            self.start()
        except BaseException as e:  # re-raised on the main thread by run()
            self._start_error = e
            self.request_stop()

    def shutdown(self) -> int:
        """Stop every stage, log ``daemon.stopped`` and return the exit status."""
        self._stop_stages()
        code = self.drain.exit_code
        log.info("daemon.stopped", exit_code=code)
        return code

    def _stop_stages(self) -> None:
        """Does not wait for a start-up that is still talking to the store: its thread dies
        with the process."""
        self.stop_event.set()
        with self._lifecycle:
            self.poller.stop()
            self.queue.close()
            self.watcher.stop()
        for t in self._threads:
            t.join(timeout=5)
        self.pool.close()
        self.cache.save()
        self.backend.close()

    def request_stop(self) -> None:
        self.stop_event.set()
        self._main_wait.wake()
