"""The one loop that drives every notice source.

One thread per source runs the same loop, so a long poll (GCP ``wait_for_change``) or a
slow first call (Azure) never delays another source. The loop owns everything sources do
not: the interval (start to start), retry delays after errors (doubling from
``retry_delay`` up to ``retry_delay_max``), error reporting and de-duplication.

Guarantees:

* ``on_notice`` is called once per distinct ``event_id``, on the thread of the source that
  saw it; calls for notices of different sources may overlap. A callback that blocks
  delays only its own source's next poll, but hand long work (the drain) to another
  thread anyway. No call starts once :meth:`Poller.stop` has been called.
* An error is never a notice, and no error ends a source's loop: anything a poll raises
  (a :class:`SourceError`, or any other exception, counted as kind ``internal``) is an
  error of that poll, and the next poll follows. Each error kind of each source is logged once
  (``preemption.error``, with the fix when there is one), again only after
  ``relog_after_seconds`` of repeats, and counted every time (:meth:`Poller.error_counts`,
  and ``on_error(source, kind)`` for metrics). ``preemption.recovered`` follows an outage.
* A deadline that is not finite or more than ``MAX_DEADLINE_SECONDS`` (a day) from the
  notice's receipt is clamped to that bound (a far past one to "now") before delivery, and
  logged ``preemption.deadline_clamped``; an event is marked seen only when it is delivered.
* :meth:`Poller.dead_threads` names the loops that ended without :meth:`Poller.stop`
  (for ``/healthz``).
* :meth:`Poller.stop` aborts requests in flight and returns within ``timeout`` (a callback
  still running then is reported as ``preemption.stop_slow`` and left to finish).
"""

from __future__ import annotations

import dataclasses
import math
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import structlog

from sidecar.manifest import rfc3339
from sidecar.model import Notice
from sidecar.preemption.base import Source, SourceError

__all__ = ["MAX_DEADLINE_SECONDS", "Poller", "SourceHealth"]

log = structlog.get_logger()
MIN_GAP = 0.01
MAX_DEADLINE_SECONDS = 86400.0
"""The furthest a deadline may lie from the notice's receipt; beyond it, it is clamped."""


@dataclass(frozen=True)
class SourceHealth:
    """How one source is doing: ``ok`` is false while its latest poll failed; ``polls`` counts
    the polls that answered (with or without a notice)."""

    label: str
    ok: bool
    consecutive_errors: int
    last_error: str | None
    polls: int = 0


class Poller:
    """Runs ``sources`` until :meth:`stop`; see the module docstring. Runs once."""

    def __init__(
        self,
        sources: Sequence[Source],
        on_notice: Callable[[Notice], None],
        *,
        on_error: Callable[[str, str], None] | None = None,
        retry_delay: float = 1.0,
        retry_delay_max: float = 5.0,
        relog_after_seconds: float = 600.0,
    ) -> None:
        self._sources = list(sources)
        self._labels = _labels(self._sources)
        self._on_notice = on_notice
        self._on_error = on_error
        self._retry_delay = retry_delay
        self._retry_delay_max = retry_delay_max
        self._relog_after = relog_after_seconds
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self._lock = threading.Lock()
        self._seen: dict[str, Source] = {}
        self._notices: list[Notice] = []
        self._counts: dict[tuple[str, str], int] = {}
        self._logged_at: dict[tuple[str, str], float] = {}
        self._health = {label: SourceHealth(label, True, 0, None) for label in self._labels}

    def start(self) -> None:
        if self._threads:
            raise RuntimeError("a Poller runs once")
        for source, label in zip(self._sources, self._labels, strict=True):
            t = threading.Thread(
                target=self._run, args=(source, label), name=f"preemption-{label}", daemon=True
            )
            self._threads.append(t)
        log.info("preemption.started", sources=self._labels)
        for t in self._threads:
            t.start()

    def stop(self, timeout: float = 1.0) -> bool:
        """Stop every loop; ``True`` when all threads ended within ``timeout``."""
        self._stop.set()
        for source in self._sources:
            source.close()
        end = time.monotonic() + timeout
        me = threading.current_thread()
        for t in self._threads:
            if t is not me:
                t.join(max(end - time.monotonic(), 0.0))
        alive = [t.name for t in self._threads if t.is_alive() and t is not me]
        if alive:
            log.warning("preemption.stop_slow", threads=alive)
        return not alive

    @property
    def notices(self) -> list[Notice]:
        """Every distinct notice delivered so far, oldest first."""
        with self._lock:
            return list(self._notices)

    def error_counts(self) -> dict[tuple[str, str], int]:
        """``(source label, error kind) -> count`` since start."""
        with self._lock:
            return dict(self._counts)

    def dead_threads(self) -> list[str]:
        """Names of the poll threads (``preemption-<label>``) that ended although
        :meth:`stop` was not called; empty before :meth:`start` and once :meth:`stop` was."""
        if self._stop.is_set():
            return []
        return [t.name for t in self._threads if t.ident is not None and not t.is_alive()]

    def health(self) -> list[SourceHealth]:
        with self._lock:
            return [self._health[label] for label in self._labels]

    def acknowledge(self, notice: Notice) -> bool:
        """Pass ``notice`` back to the source that produced it (Azure approves the event when
        ``acknowledge: after_flush``); call it after the flush, before or after :meth:`stop`.
        ``False`` only when telling the cloud failed (logged ``preemption.ack_failed``)."""
        with self._lock:
            source = self._seen.get(notice.event_id)
        if source is None:
            return True
        try:
            told = source.acknowledge(notice)
        except SourceError as e:
            log.warning("preemption.ack_failed", source=notice.source, error=str(e), fix=e.fix)
            return False
        if told:
            log.info("preemption.acknowledged", source=notice.source, event_id=notice.event_id)
        return True

    def _run(self, source: Source, label: str) -> None:
        failures = 0
        while not self._stop.is_set():
            started = time.monotonic()
            try:
                notice = source.poll()
                ready = None if notice is None else self._checked(label, notice)
                if failures:
                    log.info("preemption.recovered", source=label, failed_polls=failures)
                    failures = 0
                with self._lock:
                    polls = self._health[label].polls + 1
                    self._health[label] = SourceHealth(label, True, 0, None, polls)
                if ready is not None:
                    self._deliver(source, label, *ready)
            except Exception as e:
                if self._stop.is_set():
                    return
                failures += 1
                self._error(label, e, failures)
                delay = max(source.interval, self._retry_delay) * 2 ** min(failures - 1, 16)
                self._stop.wait(min(delay, self._retry_delay_max))
                continue
            self._stop.wait(max(source.interval - (time.monotonic() - started), MIN_GAP))

    def _checked(self, label: str, notice: Notice) -> tuple[Notice, str] | None:
        """``None`` for an event already delivered; else the notice, its deadline clamped
        (logged) when it is absurd, and that deadline in RFC 3339. Raises when the notice
        cannot be delivered (then it is an error of this poll, and not marked seen)."""
        with self._lock:
            if notice.event_id in self._seen:
                return None
        clamped = _clamp(notice)
        if clamped is not notice:
            log.warning(
                "preemption.deadline_clamped",
                source=label,
                event_id=notice.event_id,
                deadline_given=str(notice.deadline),
                deadline=rfc3339(clamped.deadline),
                bound_seconds=MAX_DEADLINE_SECONDS,
            )
        return clamped, rfc3339(clamped.deadline)

    def _error(self, label: str, e: Exception, failures: int) -> None:
        err = e if isinstance(e, SourceError) else SourceError("internal", repr(e))
        key = (label, err.kind)
        now = time.monotonic()
        with self._lock:
            self._counts[key] = self._counts.get(key, 0) + 1
            count = self._counts[key]
            polls = self._health[label].polls
            self._health[label] = SourceHealth(label, False, failures, err.kind, polls)
            last = self._logged_at.get(key)
            if last is None or now - last >= self._relog_after:
                self._logged_at[key] = now
            else:
                count = 0
        if count:
            extra = {"exc_info": True} if err is not e else {}
            log.warning(
                "preemption.error",
                source=label,
                kind=err.kind,
                error=str(err),
                fix=err.fix,
                count=count,
                **extra,
            )
        if self._on_error is not None:
            try:
                self._on_error(label, err.kind)
            except Exception:
                log.exception("preemption.on_error_failed", source=label, kind=err.kind)

    def _deliver(self, source: Source, label: str, notice: Notice, deadline: str) -> None:
        with self._lock:
            if notice.event_id in self._seen or self._stop.is_set():
                return
        log.warning(
            "preemption.notice",
            source=label,
            kind=notice.kind,
            event_id=notice.event_id,
            drain=notice.drain,
            deadline=deadline,
            seconds_left=round(notice.deadline_mono - time.monotonic(), 1),
        )
        with self._lock:
            if notice.event_id in self._seen or self._stop.is_set():
                return
            self._seen[notice.event_id] = source
            self._notices.append(notice)
        try:
            self._on_notice(notice)
        except Exception:
            log.exception("preemption.callback_failed", event_id=notice.event_id)


def _clamp(notice: Notice) -> Notice:
    """``notice`` itself when its deadline lies within ``MAX_DEADLINE_SECONDS`` of its receipt;
    else a copy with the deadline at that bound (a far past one or NaN: at receipt, "now"), the
    monotonic deadline moved with it and the given value kept in ``detail``."""
    given, received = notice.deadline, notice.received_at
    if received - MAX_DEADLINE_SECONDS <= given <= received + MAX_DEADLINE_SECONDS:
        return notice
    soon = given < received or math.isnan(given)  # past, or unreadable: now
    deadline = received if soon else received + MAX_DEADLINE_SECONDS
    received_mono = notice.deadline_mono - (given - received)
    if not math.isfinite(received_mono):
        received_mono = time.monotonic() - max(time.time() - received, 0.0)
    return dataclasses.replace(
        notice,
        deadline=deadline,
        deadline_mono=received_mono + (deadline - received),
        detail={**notice.detail, "deadline_given": str(given)},
    )


def _labels(sources: Sequence[Source]) -> list[str]:
    """A source's ``label`` attribute if it has one, else its name; made unique (``file``,
    ``file#2``) for logs and health."""
    seen: dict[str, int] = {}
    out = []
    for s in sources:
        base = str(getattr(s, "label", s.name))
        seen[base] = seen.get(base, 0) + 1
        out.append(base if seen[base] == 1 else f"{base}#{seen[base]}")
    return out
