"""The drain: on a notice, tell the trainer, put the newest checkpoint first, lift caps,
wait until it is durable or the deadline passes, and report the outcome.

Guarantees: one notice is handled once (by event id); a drain lasts until its deadline,
and a notice after that starts a new one (the trainer is told again); only checkpoints not
yet started are superseded, and a started one is cancelled only when it is not the one the
drain chose; ``exit_code`` is 0 when the newest complete checkpoint is durable at the end,
4 otherwise; also 4 when start-up never reached the store and the watch folder holds
checkpoints (none of them is known durable).
"""

from __future__ import annotations

import json
import os
import signal
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import structlog

from sidecar.atomic_write import write_atomically
from sidecar.client import NOTICE_FILE  # one name, shared with the trainer's side
from sidecar.manifest import rfc3339
from sidecar.model import CheckpointReady, EntryKind, Notice
from sidecar.watch.watcher import DRAIN_LOOK_SECONDS

if TYPE_CHECKING:
    from sidecar.app import Daemon

__all__ = ["NOTICE_FILE", "DrainController"]

log = structlog.get_logger("sidecar.drain")
#: a drain that waits for start-up to reach the store gives up this long before its deadline,
#: so that it still reports (exit 4, ``drain.unverified``) and stops in time
_STARTUP_GIVE_UP_SECONDS = 3.0


def clear_stale_notice(root: Path) -> None:
    """At start: a notice file left by an earlier run would stop a resuming trainer at once."""
    try:
        (root / NOTICE_FILE).unlink()
    except FileNotFoundError:
        return
    except OSError as e:
        log.warning("drain.stale_notice_not_removed", path=str(root / NOTICE_FILE), error=str(e))
        return
    log.info("drain.stale_notice_removed", path=str(root / NOTICE_FILE))


class DrainController:
    def __init__(self, daemon: Daemon) -> None:
        self.d = daemon
        self.notice: Notice | None = None
        self._until = float("-inf")  # monotonic end of the drain: the latest deadline in it
        self.exit_code = 0
        self._stopping = False  # a drain that stops the daemon has reported: its status holds
        self._seen: set[str] = set()
        self._lock = threading.Lock()
        self._telling = threading.Lock()
        self._changed = threading.Condition()
        self.outcome: dict[str, Any] | None = None

    @property
    def state(self) -> str:
        """``draining`` from a notice until the latest deadline of the notices that came
        during it, else ``running``: a drain whose deadlines all passed while the daemon still
        runs (SIGUSR1, ``POST /v1/drain``, a notice the cloud did not act on) is over, and the
        next notice starts a new one. ``notice`` is the one with the earliest deadline."""
        return "draining" if time.monotonic() < self._until else "running"

    def notice_json(self) -> dict[str, str] | None:
        n = self.notice
        if n is None:
            return None
        return {
            "source": n.source,
            "kind": n.kind,
            "deadline": rfc3339(n.deadline),
            "received_at": rfc3339(n.received_at),
        }

    def _tell_trainer(self) -> None:
        with self._telling:  # one at a time, each writing the earliest deadline known then
            self._tell_trainer_now()

    def _tell_trainer_now(self) -> None:
        root = self.d.cfg.watch.path
        data = json.dumps(self.notice_json()).encode()
        try:
            write_atomically(root, NOTICE_FILE, data)
        except OSError as e:
            log.error("drain.notice_file_failed", path=str(root / NOTICE_FILE), error=str(e))
        cfg = self.d.cfg.preemption
        if cfg.notify_signal and cfg.notify_pid_file:
            try:
                pid = int(cfg.notify_pid_file.read_text().strip())
                os.kill(pid, signal.Signals[cfg.notify_signal.upper()])
                log.info("drain.trainer_signalled", pid=pid, signal=cfg.notify_signal)
            except (OSError, ValueError, KeyError) as e:
                log.warning("drain.trainer_signal_failed", error=str(e))

    def start(self, notice: Notice, *, exit_after: bool) -> None:
        with self._lock:
            if notice.event_id in self._seen:
                return
            self._seen.add(notice.event_id)
            self.d.metrics.notices.labels(notice.source, notice.kind).inc()
            if not notice.drain:
                log.info("preemption.early_warning", source=notice.source, kind=notice.kind)
                self.d.limiter.lift()
                return
            first = self.state == "running"
            earlier = self.notice is None or notice.deadline_mono < self.notice.deadline_mono
            if first or earlier:
                self.notice = notice
            self._until = max(self._until, notice.deadline_mono)
        if first or earlier:  # the trainer hears of a drain, and of any earlier deadline
            self._tell_trainer()  # the trainer's emergency checkpoint is the priority
        log.warning(
            "drain.started",
            source=notice.source,
            kind=notice.kind,
            deadline=rfc3339(notice.deadline),
            seconds_left=round(notice.deadline_mono - time.monotonic(), 1),
        )
        self.d.limiter.lift(until=notice.deadline_mono)
        self._reprioritise()
        self._wait_and_report(notice.deadline_mono, exit_after)

    def _reprioritise(self, arrived: CheckpointReady | None = None) -> None:
        for old in self.d.queue.supersede_all_but_newest():
            self.d.metrics.superseded.inc()
            log.info("checkpoint.superseded", checkpoint=old.name, reason="drain")
        chosen = self.d.queue.newest()
        with self.d.lock:
            current, cancel = self.d.current, self.d.current_cancel
            sent = self.d.pool.meter.total - self.d.current_start_bytes
        if current is None or chosen is None or chosen.order() <= current.order():
            return
        assert self.notice is not None
        # Measured (in part) under upload.max_bandwidth_bytes_per_second, lifted as the drain
        # began, the rate says nothing of the link: then the newest goes first, as without a
        # measurement. Once a whole window has gone by uncapped, it does.
        meter = self.d.pool.meter
        rate = meter.rate() if self.d.limiter.uncapped_for() >= meter.window else 0.0
        left = self.notice.deadline_mono - time.monotonic()
        current_left = max(current.size - sent, 0)
        if rate > 0 and chosen.size / rate > left and current_left / rate <= 0.9 * left:
            log.warning(
                "drain.older_first",
                checkpoint=current.name,
                chosen=chosen.name,
                reason="the newest cannot be whole before the deadline at the measured rate; "
                "the older one nearly done can",
                rate_bytes_per_second=round(rate),
                seconds_left=round(left, 1),
            )
            return
        log.warning("drain.cancel_older", checkpoint=current.name, chosen=chosen.name)
        cancel.set()

    def on_ready(self, item: CheckpointReady) -> None:
        if self.state == "draining" and item.kind is EntryKind.CHECKPOINT:
            log.warning("drain.emergency_checkpoint", checkpoint=item.name)
            self._reprioritise(item)
        self.after_item()

    def after_item(self) -> None:
        with self._changed:
            self._changed.notify_all()

    def _idle(self) -> bool:
        n, _, _ = self.d.queue.depth()
        with self.d.lock:
            return n == 0 and self.d.current is None and not self.d.pending.names()

    def _saving(self) -> list[str]:
        """Checkpoints being written now; a failure to tell is logged and taken for none, so
        the drain still ends (it read the watcher's entries from this thread)."""
        try:
            return self.d.watcher.in_progress()
        except Exception:
            log.exception("drain.saving_unknown")
            return []

    def _unwatched(self) -> list[str]:
        """Before the watcher runs (start-up has not reached the store): the entries of the
        watch folder that the layout takes for checkpoints, complete or not; this run
        uploaded none of them. Empty once watching."""
        if self.d.health.watching:
            return []
        tracker = self.d.watcher.tracker
        try:
            names = [e.name for e in os.scandir(tracker.root)]
        except OSError:
            return []
        return sorted(
            n
            for n in names
            if (k := tracker.key_of(tracker.root / n)) and k[1] is EntryKind.CHECKPOINT
        )

    def _wait_and_report(self, deadline: float, exit_after: bool) -> None:
        """Wait until the work is done or this notice's own deadline (a SIGTERM's grace is
        all the kubelet gives, however far a cloud notice's deadline), then report."""
        started = time.monotonic()
        watch = self.d.cfg.watch
        # Quiet for this long ends the wait: a file closed just now is handed off by then; in
        # polling mode a new one is not even seen before the next poll.
        quiet = min(watch.settle_seconds, 1.0) + 0.2
        polling = self.d.watcher.mode == "poll"
        if polling:  # a save begun now is seen at the next look, asked for every second
            quiet += DRAIN_LOOK_SECONDS
        self.d.watcher.rescan()
        looked = time.monotonic()
        quiet_since: float | None = None
        told: list[str] = []
        with self._changed:
            while time.monotonic() < deadline:
                if polling and time.monotonic() - looked >= DRAIN_LOOK_SECONDS:
                    self.d.watcher.rescan()
                    looked = time.monotonic()
                saving = self._saving()
                if saving and saving != told:
                    told = saving
                    log.info("drain.waiting_for_save", checkpoints=saving)
                # Start-up still on its way to the store with checkpoints in the folder: they
                # may yet go up (a slow first answer); wait for it, but report and stop before
                # the deadline when it never comes.
                starting = (
                    deadline - time.monotonic() > _STARTUP_GIVE_UP_SECONDS
                    and not self.d.health.watching
                    and bool(self._unwatched())
                )
                if self._idle() and not saving and not starting:
                    quiet_since = quiet_since or time.monotonic()
                    if time.monotonic() - quiet_since >= quiet:
                        break
                else:
                    quiet_since = None
                self.d.metrics.deadline_remaining.set(deadline - time.monotonic())
                self._changed.wait(0.1)
        self.d.metrics.deadline_remaining.set(0)
        saving = self._saving()
        missing = self.d.pending.names()
        if unwatched := self._unwatched():  # nothing was pending then
            log.error(
                "drain.unverified",
                checkpoints=unwatched,
                reason="start-up never reached the destination, so the watch folder was not "
                "uploaded; none of these is known durable",
            )
            missing = unwatched
        durable = not missing
        outcome = "committed" if durable else "missed"
        used = time.monotonic() - started
        self.d.metrics.drains.labels(outcome).inc()
        self.d.metrics.drain_seconds.observe(used)
        last = self.d.last_committed
        self.outcome = {
            "outcome": outcome,
            "seconds": round(used, 3),
            "margin_seconds": round(deadline - time.monotonic(), 3),
            "last_committed": last,
            "not_durable": missing,
            "still_being_saved": saving,
        }
        log_fn = log.info if durable else log.error
        log_fn("drain.done", **self.outcome)
        with self._lock:
            if self._stopping:  # the exit status is the stopping drain's; keep it
                return
            self.exit_code = 0 if durable else 4
            self._stopping = exit_after
        if exit_after:
            self.d.request_stop()
