"""The orphan sweep: delete objects that no manifest names and no upload owns, once old.

Orphans come from two kinds of interruption: a kill after a checkpoint's objects but before
its manifest (the next attempt usually writes the same keys again, but a checkpoint the
trainer deleted meanwhile never comes back), and retention killed after deleting a manifest
(the tombstone) but before its objects.

Guarantees:

* Only keys that belong to a checkpoint name of the configured layout are candidates
  (``name``, ``name/...``, ``name@gN``, ``name@gN/...``); anything else in the destination is
  not ours and is never touched, nor is anything under ``.ckpt-sidecar/``, nor anything in
  a first-level folder that holds a ``.ckpt-sidecar/`` of its own (another node's or run's
  destination nested in this one).
* The set of live keys comes from a fresh, complete listing of the manifests taken *before*
  the objects are listed. A listing that lacks the manifest ``LATEST`` names (the newest
  commit) while the store holds it is taken for incomplete and stops the sweep; so does
  any storage error while listing. A manifest that cannot be read or parsed keeps every
  object of its checkpoint name (any of them might be live); the rest is swept.
* A delete that fails is reported and the sweep goes on with the next key.
* Only objects whose store time is older than ``older_than`` seconds are deleted: an upload in
  progress (here or on another host) is far younger than a day.
* ``abort()`` is checked between deletes, so a new checkpoint or a drain never waits long.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable
from dataclasses import dataclass

import structlog

from sidecar.catalog import Catalog
from sidecar.manifest import MANIFEST_PREFIX
from sidecar.metrics import Metrics
from sidecar.storage.base import Backend, NotFound
from sidecar.watch.layouts import Layout

__all__ = ["OrphanSweeper", "SweepResult", "owner_name", "sweep_orphans"]

log = structlog.get_logger("sidecar.orphans")

_GENERATION = re.compile(r"@g[0-9]+$")
SWEEP_EVERY_SECONDS = 6 * 3600.0
RETRY_INCOMPLETE_SECONDS = 600.0
_OURS = ".ckpt-sidecar"


@dataclass(frozen=True)
class SweepResult:
    deleted: tuple[str, ...] = ()
    skipped_reason: str | None = None


def owner_name(key: str) -> tuple[str, bool] | None:
    """The checkpoint name a data key would belong to, and whether that entry is a folder;
    None for our own bookkeeping keys."""
    first, sep, _ = key.partition("/")
    if not first or first.startswith(_OURS):
        return None
    return _GENERATION.sub("", first), bool(sep)


def sweep_orphans(
    backend: Backend,
    layout: Layout,
    *,
    older_than: float,
    now: Callable[[], float] = time.time,
    abort: Callable[[], bool] = lambda: False,
) -> SweepResult:
    """Delete orphans older than ``older_than`` seconds; never raises for storage errors (they
    end the sweep and are reported in ``skipped_reason``)."""
    invalid: list[str] = []
    try:
        catalog = Catalog().fill_from(backend, lambda key, reason: invalid.append(key))
    except Exception as e:  # a store that is down: try again at the next sweep
        return SweepResult(skipped_reason=f"listing manifests failed: {e}")
    listed = {m.key for m in catalog.all()} | set(invalid)
    newest = catalog.latest_manifest
    if newest is not None and newest not in listed and _exists(backend, newest):
        return SweepResult(
            skipped_reason=f"the newest commit's manifest {newest} is not in the listing of "
            "manifests: it may be incomplete, so every object could look like an orphan"
        )
    # A manifest that cannot be read may name any object of its checkpoint name: keep them.
    kept = {o[0] for k in invalid if (o := owner_name(_manifest_base(k))) is not None}
    live = {f.key for m in catalog.all() for f in m.files}
    cutoff = now() - older_than
    deleted: list[str] = []
    failed: list[str] = []
    candidates: list[tuple[str, float]] = []
    foreign: set[str] = set()  # first folders holding another destination's bookkeeping
    try:
        for info in backend.list(""):
            if abort():
                return SweepResult(tuple(deleted), "interrupted by new work")
            first, _, rest = info.key.partition("/")
            if f"/{_OURS}/" in f"/{rest}":
                foreign.add(first)  # e.g. node-1/.ckpt-sidecar/...: another node's prefix
            owner = owner_name(info.key)
            if owner is None or info.key in live or not layout.matches(*owner):
                continue
            if owner[0] in kept:
                continue
            if info.mtime is None or info.mtime > cutoff:
                continue
            candidates.append((info.key, info.mtime))
        for key, mtime in candidates:
            if key.partition("/")[0] in foreign:
                continue
            if abort():
                return SweepResult(tuple(deleted), "interrupted by new work")
            try:
                backend.delete(key)
            except Exception as e:  # e.g. an object under a legal hold: the rest goes on
                failed.append(f"{key}: {e}")
                continue
            deleted.append(key)
            log.info("orphans.deleted", key=key, age_hours=round((now() - mtime) / 3600))
    except Exception as e:
        return SweepResult(tuple(deleted), f"sweep stopped: {e}")
    if kept:  # not an unfinished sweep: it would be the same at the next one
        log.warning(
            "orphans.kept",
            checkpoints=sorted(kept),
            reason="a manifest of theirs cannot be read, so any of their objects may be live",
        )
    if failed:
        return SweepResult(tuple(deleted), f"{len(failed)} not deleted, first {failed[0]}")
    return SweepResult(tuple(deleted))


def _manifest_base(key: str) -> str:
    """``name`` or ``name@gN`` of a manifest key (``.ckpt-sidecar/manifests/<it>.json``)."""
    return key.removeprefix(MANIFEST_PREFIX).removesuffix(".json")


def _exists(backend: Backend, key: str) -> bool:
    """Whether ``key`` is in the store (a ``LATEST`` that names a manifest deleted since, by
    retention or by hand, is only out of date: the listing is not the one at fault)."""
    try:
        backend.head(key)
    except NotFound:
        return False
    return True


class OrphanSweeper:
    """When to sweep: :meth:`maybe` sweeps at its first call, then every
    :data:`SWEEP_EVERY_SECONDS` (ten minutes after a sweep that did not finish); each sweep
    is counted (``orphans_deleted``) and logged. ``older_than_hours`` 0 turns it off.

    The daemon calls it on its commit thread while idle, so no upload of its own is running.
    """

    def __init__(
        self,
        backend: Backend,
        layout: Layout,
        metrics: Metrics,
        older_than_hours: float,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.backend = backend
        self.layout = layout
        self.metrics = metrics
        self.hours = older_than_hours
        self.clock = clock
        self._next = clock()

    def due_in(self) -> float | None:
        """Seconds until the next sweep is due (0 when it is); None when sweeping is off."""
        if not self.hours:
            return None
        return max(0.0, self._next - self.clock())

    def maybe(self, abort: Callable[[], bool]) -> None:
        """Sweep if one is due; ``abort()`` (new work, a drain) stops it between deletes."""
        if not self.hours or self.clock() < self._next:
            return
        result = sweep_orphans(self.backend, self.layout, older_than=self.hours * 3600, abort=abort)
        self.metrics.orphans_deleted.inc(len(result.deleted))
        if result.skipped_reason:
            self._next = self.clock() + RETRY_INCOMPLETE_SECONDS
            log.warning(
                "orphans.sweep_incomplete",
                deleted=len(result.deleted),
                reason=result.skipped_reason,
                action=f"tried again in {RETRY_INCOMPLETE_SECONDS / 60:.0f} minutes",
            )
        else:
            self._next = self.clock() + SWEEP_EVERY_SECONDS
            log.info("orphans.swept", deleted=len(result.deleted), older_than_hours=self.hours)
