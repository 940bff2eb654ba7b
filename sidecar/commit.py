"""Committing one checkpoint: choose the generation, upload or copy every file, then write
the manifest last (create-only), then ``LATEST``, then apply retention.

Invariants kept here (DESIGN.md "Contracts"): a manifest names only objects whose upload
finished with the recorded size and CRC32C; nothing is written over a key a live manifest
names (a name committed with other content gets the next generation); a create-only
conflict is compared, never assumed; a checkpoint is reported committed only when its own
manifest is written.
"""

from __future__ import annotations

import enum
import json
import os
import socket
import threading
import time
from collections.abc import Callable
from pathlib import Path

import structlog

from sidecar import __version__
from sidecar.catalog import Catalog
from sidecar.coverage import saved_with_newer_here, written_after
from sidecar.manifest import (
    LATEST_KEY,
    Manifest,
    ManifestError,
    ManifestFile,
    manifest_key,
    object_base,
    parse,
    rfc3339,
)
from sidecar.metrics import Metrics
from sidecar.model import CheckpointReady
from sidecar.retention import Retention
from sidecar.state import StateCache
from sidecar.storage.base import AlreadyExists, Backend, NotFound
from sidecar.upload.pool import FileJob, UploaderPool
from sidecar.upload.retry import Backoff, retry
from sidecar.watch.scan import state_of

__all__ = ["Committer", "Outcome"]

log = structlog.get_logger("sidecar.commit")
_MAX_CONFLICTS = 5


class Outcome(enum.Enum):
    COMMITTED = "committed"
    ALREADY = "already_committed"
    OUTRANKED = "outranked"


class _Unreadable:
    """A manifest that is there but does not parse."""


UNREADABLE = _Unreadable()


class Committer:
    """Runs on the daemon's single commit thread; raises what the pool raises."""

    def __init__(
        self,
        backend: Backend,
        catalog: Catalog,
        pool: UploaderPool,
        cache: StateCache,
        retention: Retention,
        metrics: Metrics,
        backoff: Backoff,
        stop: threading.Event,
        on_committed: Callable[[CheckpointReady], None] | None = None,
    ) -> None:
        self.backend = backend
        self.catalog = catalog
        self.pool = pool
        self.cache = cache
        self.retention = retention
        self.metrics = metrics
        self.backoff = backoff
        self.stop = stop
        self.on_committed = on_committed
        self._told_stepless: set[str] = set()  # names without a step warned about once
        self.host = socket.gethostname()

    def _crc(self, p: Path) -> str:
        st = state_of(os.lstat(p))
        cached = self.cache.get(p, st)
        if cached is not None:
            return cached
        crc = self.pool.checksum(p)
        self.cache.put(p, st, crc)
        return crc

    def matches(self, item: CheckpointReady, m: Manifest, *, read: bool = True) -> bool:
        """Do the local files equal what ``m`` records: same paths and sizes, then the same
        CRC32C from the checksum cache or, if ``read``, from reading the file (a cache miss
        without ``read`` is "no")?"""
        recorded = {f.path: f for f in m.files}
        local = {self._path_in_manifest(item, f.rel): f for f in item.files}
        if set(recorded) != set(local) or m.is_dir != item.is_dir:
            return False
        if any(recorded[p].size != f.state.size for p, f in local.items()):
            return False
        for p, f in local.items():
            crc = self._crc(f.path) if read else self.cache.get(f.path, f.state)
            if crc != recorded[p].crc32c:
                return False
        return True

    def known_committed(self, item: CheckpointReady) -> Manifest | None:
        """The committed manifest ``item`` equals, judged without reading any file (sizes,
        and CRC32Cs the checksum cache holds for the files as the watcher saw them). None
        when unsure: then :meth:`commit` decides, reading if needed."""
        prev = self.catalog.latest_for(item.name)
        return prev if prev is not None and self.matches(item, prev, read=False) else None

    @staticmethod
    def _path_in_manifest(item: CheckpointReady, rel: str) -> str:
        return rel if item.is_dir else item.name

    def _already(self, item: CheckpointReady, generation: int) -> Outcome:
        if self.on_committed is not None:
            self.on_committed(item)
        log.info("checkpoint.already_committed", checkpoint=item.name, generation=generation)
        return Outcome.ALREADY

    def _outranked(self, item: CheckpointReady, manifests: list[Manifest]) -> Outcome:
        """Not uploaded. It is covered by the newer durable checkpoints when it is an old
        local copy (no file written after the newest commit, e.g. found again after a
        restart) or one of them is in the watch folder too (a name without a step beside
        stepped ones). Otherwise (a new run in an old destination) it is not durable: it
        stays unprotected, so the gauge and a drain say so."""
        newest = max(manifests, key=Manifest.order)
        old = not written_after(item, newest)
        if old or saved_with_newer_here(item, manifests):
            if self.on_committed is not None:
                self.on_committed(item)
            stepless = item.step is None and not old and item.name not in self._told_stepless
            if stepless:  # tell once that it never goes up, not at every save
                self._told_stepless.add(item.name)
            (log.warning if stepless else log.info)(
                "checkpoint.outranked",
                checkpoint=item.name,
                step=item.step,
                keep_last=self.retention.keep_last,
                action="not uploaded: retention keeps newer checkpoints",
                **(
                    {
                        "reason": "its name has no step, so it orders below every stepped "
                        "checkpoint, and restore would never choose it",
                        "fix": "put the step in its name (checkpoint.step_regex) to have "
                        "it uploaded",
                    }
                    if stepless
                    else {}
                ),
            )
            return Outcome.OUTRANKED
        log.warning(
            "checkpoint.outranked",
            checkpoint=item.name,
            step=item.step,
            newest=newest.name,
            newest_step=newest.step,
            keep_last=self.retention.keep_last,
            action="not uploaded and not durable",
            reason=f"written after {newest.name} was committed, yet {self.retention.keep_last} "
            "committed checkpoints have a higher step (retention and restore order by step; "
            "a name without a step sorts below every step), so retention would delete it at once",
            fix="give each run its own destination prefix, or put the step in the "
            "checkpoint's name (checkpoint.step_regex)",
        )
        return Outcome.OUTRANKED

    def _conflict(self, item: CheckpointReady, generation: int, manifest: str) -> None:
        self.metrics.conflicts.inc()
        log.warning(
            "checkpoint.manifest_conflict",
            checkpoint=item.name,
            generation=generation,
            manifest=manifest,
            action="next generation",
        )

    def commit(self, item: CheckpointReady, cancel: threading.Event) -> Outcome:
        prev = self.catalog.latest_for(item.name)
        if prev is not None and self.matches(item, prev):
            return self._already(item, prev.generation)
        manifests = self.catalog.all()
        if self.retention.outranked(item.step, manifests):
            # Retention would delete it right after its commit: do not upload it at all.
            return self._outranked(item, manifests)
        generation = 0 if prev is None else prev.generation + 1
        for _ in range(_MAX_CONFLICTS):
            # A manifest our catalog did not know (another writer, a stale view): its objects
            # are committed and immutable, so never upload over them; compare instead.
            key = manifest_key(item.name, generation)
            existing = self._fetch_existing(key)
            if existing is not None:  # unreadable: it may name objects under these keys
                if isinstance(existing, Manifest):
                    self.catalog.add(existing)
                    if self.matches(item, existing):
                        return self._already(item, generation)
                self._conflict(item, generation, key)
                generation += 1
                continue
            outcome = self._commit_generation(item, generation, cancel)
            if outcome is not None:
                return outcome
            generation += 1
        raise RuntimeError(f"{item.name}: {_MAX_CONFLICTS} manifest conflicts in a row")

    def _commit_generation(
        self, item: CheckpointReady, generation: int, cancel: threading.Event
    ) -> Outcome | None:
        base = object_base(item.name, generation)
        refs: dict[str, ManifestFile] = {}
        for committed in self.catalog.all():  # newest first: the newest copy of each path wins
            for mf in committed.files:
                refs.setdefault(mf.path, mf)
        jobs = []
        for f in item.files:
            path = self._path_in_manifest(item, f.rel)
            key = f"{base}/{f.rel}" if item.is_dir else base
            jobs.append(FileJob(f, key, refs.get(path)))
        results = self.pool.upload_files(jobs, cancel)
        by_rel = {r.rel: r for r in results}
        files = tuple(
            sorted(
                (
                    ManifestFile(
                        self._path_in_manifest(item, f.rel),
                        by_rel[f.rel].key,
                        by_rel[f.rel].size,
                        by_rel[f.rel].crc32c,
                    )
                    for f in item.files
                ),
                key=lambda mf: mf.path,
            )
        )
        top = self.catalog.newest()
        if (
            item.step is not None
            and top is not None
            and top.step is not None
            and item.step < top.step
        ):
            log.warning(
                "checkpoint.step_lower_than_committed",
                checkpoint=item.name,
                step=item.step,
                newest_step=top.step,
                hint="a new run in an old destination? retention orders by (step, sequence)",
            )
        manifest = Manifest(
            name=item.name,
            generation=generation,
            layout=item.layout,
            is_dir=item.is_dir,
            step=item.step,
            sequence=self.catalog.next_sequence(),
            completed_at=rfc3339(item.completed_at),
            committed_at=rfc3339(time.time()),
            host=self.host,
            sidecar_version=__version__,
            files=files,
        )
        try:
            retry(
                lambda: self.backend.put_bytes(manifest.key, manifest.to_json(), create_only=True),
                self.backoff,
                on_retry=lambda n, e, d: self.pool.note_retry("manifest", manifest.key, n, e, d),
                wait=self.stop.wait,
            )
        except AlreadyExists:
            existing = self._probe(manifest.key)
            if isinstance(existing, Manifest):
                self.catalog.add(existing)
                if existing == manifest:  # our own write; its reply was lost and retried
                    self._after_commit(item, manifest, sum(r.copied for r in results))
                    return Outcome.COMMITTED
                if existing.same_content(manifest):
                    return self._already(item, generation)
            self._conflict(item, generation, manifest.key)
            return None
        self.catalog.add(manifest)
        self._after_commit(item, manifest, results_copied=sum(r.copied for r in results))
        return Outcome.COMMITTED

    def _fetch_existing(self, key: str) -> Manifest | _Unreadable | None:
        """The manifest at ``key``; None if absent; ``UNREADABLE`` if it is there but does
        not parse (damaged, or a newer format), so its objects are never written over. A
        store that fails is retried per the backoff (each retry counted and logged), then
        its error raised."""
        return retry(
            lambda: self._probe(key),
            self.backoff,
            on_retry=lambda n, e, d: self.pool.note_retry("read_manifest", key, n, e, d),
            wait=self.stop.wait,
        )

    def _probe(self, key: str) -> Manifest | _Unreadable | None:
        try:
            return parse(self.backend.get_bytes(key), where=key)
        except NotFound:
            return None
        except ManifestError as e:
            log.warning("checkpoint.manifest_unreadable", manifest=key, error=str(e))
            return UNREADABLE

    def _after_commit(self, item: CheckpointReady, m: Manifest, results_copied: int) -> None:
        if self.on_committed is not None:
            self.on_committed(item)
        latency = time.monotonic() - item.completed_mono
        self.metrics.commit_latency.observe(latency)
        self.metrics.committed.inc()
        newest = self.catalog.newest()
        if newest is not None and newest.step is not None:
            self.metrics.last_step.set(newest.step)
        self.metrics.last_commit_time.set(time.time())
        log.info(
            "checkpoint.committed",
            checkpoint=item.name,
            generation=m.generation,
            step=m.step,
            files=len(m.files),
            bytes=m.size,
            copied_files=results_copied,
            seconds=round(latency, 3),
            manifest=m.key,
        )
        pointer = {
            "name": m.name,
            "generation": m.generation,
            "manifest": m.key,
            "step": m.step,
            "sequence": m.sequence,
            "committed_at": m.committed_at,
        }
        try:
            self.backend.put_bytes(LATEST_KEY, json.dumps(pointer).encode())
        except Exception as e:  # the pointer is a convenience; restore never trusts it alone
            log.warning("checkpoint.latest_pointer_failed", error=str(e))
        self.cache.save()
        self.retention.apply(self.catalog)
