"""Remote retention after a commit: ``keep_last`` newest, plus every ``keep_every_steps``.

Order of deletes: the manifest first (the tombstone: from then on the checkpoint does not
count), then its objects, skipping any key another live manifest names. A manifest is read
again just before its delete and kept if it is no longer what the catalog holds. The newest
committed checkpoint is never deleted. Failures are logged and retried at the next commit.
"""

from __future__ import annotations

import structlog

from sidecar.catalog import Catalog
from sidecar.manifest import Manifest, ManifestError, parse
from sidecar.storage.base import Backend, NotFound, StorageError

__all__ = ["Retention"]

log = structlog.get_logger("sidecar.retention")


class Retention:
    def __init__(self, backend: Backend, keep_last: int, keep_every_steps: int = 0) -> None:
        if keep_last < 2:
            raise ValueError("retention.keep_last must be >= 2")
        self.backend = backend
        self.keep_last = keep_last
        self.keep_every = keep_every_steps

    def doomed(self, manifests: list[Manifest]) -> list[Manifest]:
        """Which of ``manifests`` (newest first) retention deletes."""
        out = []
        for i, m in enumerate(manifests):
            if i < self.keep_last:
                continue
            if self.keep_every and m.step is not None and m.step % self.keep_every == 0:
                continue
            out.append(m)
        return out

    def outranked(self, step: int | None, manifests: list[Manifest]) -> bool:
        """Would a checkpoint at ``step``, committed now, be deleted at once? True when
        ``keep_last`` committed checkpoints have a higher step and ``keep_every_steps`` does
        not keep it (e.g. old local checkpoints found again after a restart)."""
        if self.keep_every and step is not None and step % self.keep_every == 0:
            return False
        mine = step if step is not None else -1
        return sum(1 for m in manifests if m.order()[0] > mine) >= self.keep_last

    def apply(self, catalog: Catalog) -> list[Manifest]:
        manifests = catalog.all()
        doomed = self.doomed(manifests)
        if not doomed:
            return []
        deleted = []
        for m in doomed:
            state = self._still_as_read(m, catalog)
            if state == "changed":
                continue
            try:
                if state == "same":  # "gone": its delete went through, its reply was lost
                    self.backend.delete(m.key)
            except StorageError as e:
                log.warning("retention.delete_failed", manifest=m.key, error=str(e))
                continue
            catalog.remove(m)
            live = {f.key for other in catalog.all() for f in other.files}
            for f in m.files:
                if f.key in live:
                    continue
                try:
                    self.backend.delete(f.key)
                except StorageError as e:
                    log.warning("retention.delete_failed", key=f.key, error=str(e))
            deleted.append(m)
            log.info("retention.deleted", checkpoint=m.name, generation=m.generation, step=m.step)
        return deleted

    def _still_as_read(self, m: Manifest, catalog: Catalog) -> str:
        """``same`` when the store still holds ``m`` as the catalog read it; ``gone`` when
        its manifest is deleted already (its objects still go); ``changed`` when it cannot
        be read or another writer on this prefix (a daemon restarted while the old one still
        runs) committed the same name and generation again since: that checkpoint is not
        ours to delete, and the catalog takes what the store holds."""
        try:
            current = parse(self.backend.get_bytes(m.key), m.key)
        except NotFound:
            return "gone"
        except (StorageError, ManifestError) as e:
            log.warning("retention.delete_failed", manifest=m.key, error=str(e))
            return "changed"
        if current == m:
            return "same"
        log.warning(
            "retention.changed",
            manifest=m.key,
            reason="committed again since it was read (another daemon on this prefix?); "
            "not deleted",
        )
        catalog.remove(m)
        catalog.add(current)
        return "changed"
