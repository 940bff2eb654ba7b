"""The destination's committed checkpoints, as read from its manifests.

A cache of what ``.ckpt-sidecar/manifests/`` holds; the daemon updates it as it commits and
deletes. Manifests that do not parse are reported and left alone (never trusted).
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

import structlog

from sidecar.manifest import LATEST_KEY, MANIFEST_PREFIX, Manifest, ManifestError, parse
from sidecar.storage.base import Backend, NotFound

__all__ = ["MANIFEST_READERS", "Catalog"]

log = structlog.get_logger("sidecar.catalog")

#: Manifests read at once by :meth:`Catalog.fill_from`.
MANIFEST_READERS = 8


def _read_manifest(backend: Backend, key: str) -> Manifest | ManifestError | None:
    """The manifest at ``key``; its parse error; or None if it vanished since the listing."""
    try:
        return parse(backend.get_bytes(key), where=key)
    except NotFound:
        return None
    except ManifestError as e:
        return e


class Catalog:
    """Thread-safe view of committed manifests, keyed by manifest key."""

    def __init__(self) -> None:
        self._by_key: dict[str, Manifest] = {}
        self._lock = threading.Lock()
        self._max_sequence = -1
        #: the manifest key ``LATEST`` named at the last fill (the newest commit), if any
        self.latest_manifest: str | None = None

    @classmethod
    def load(
        cls, backend: Backend, on_invalid: Callable[[str, str], None] | None = None
    ) -> Catalog:
        """List and read every manifest; invalid ones go to ``on_invalid(key, reason)``."""
        return cls().fill_from(backend, on_invalid)

    def fill_from(
        self, backend: Backend, on_invalid: Callable[[str, str], None] | None = None
    ) -> Catalog:
        """Add every valid manifest of ``backend`` (idempotent: safe to call again after an
        interrupted listing) and raise the sequence floor to ``LATEST``'s. Returns ``self``.

        Manifests are read :data:`MANIFEST_READERS` at a time (one request each, so start-up
        on a store with 20-50 ms per request does not grow with their number one by one);
        ``on_invalid`` is called on this thread, in key order. A storage error is raised.
        """
        keys = [i.key for i in backend.list(MANIFEST_PREFIX) if i.key.endswith(".json")]
        if keys:
            with ThreadPoolExecutor(
                min(MANIFEST_READERS, len(keys)), thread_name_prefix="manifests"
            ) as readers:
                read = list(readers.map(lambda k: _read_manifest(backend, k), keys))
            for key, got in zip(keys, read, strict=True):
                if isinstance(got, ManifestError):
                    if on_invalid:
                        on_invalid(key, str(got))
                elif got is not None and got.key != key:
                    if on_invalid:
                        on_invalid(key, f"names {got.name!r} generation {got.generation}")
                elif got is not None:
                    self.add(got)
        try:
            latest = json.loads(backend.get_bytes(LATEST_KEY))
            seq = latest.get("sequence") if isinstance(latest, dict) else None
            if isinstance(seq, int):
                self.add_sequence_floor(seq)
            named = latest.get("manifest") if isinstance(latest, dict) else None
            self.latest_manifest = named if isinstance(named, str) else None
        except (NotFound, ValueError):
            pass
        return self

    def add(self, m: Manifest) -> None:
        with self._lock:
            self._by_key[m.key] = m
            self._max_sequence = max(self._max_sequence, m.sequence)

    def add_sequence_floor(self, sequence: int) -> None:
        """Never hand out a sequence at or below ``sequence`` (e.g. from ``LATEST``)."""
        with self._lock:
            self._max_sequence = max(self._max_sequence, sequence)

    def remove(self, m: Manifest) -> None:
        with self._lock:
            self._by_key.pop(m.key, None)

    def all(self) -> list[Manifest]:
        """Every manifest, newest first by (step, sequence)."""
        with self._lock:
            return sorted(self._by_key.values(), key=Manifest.order, reverse=True)

    def latest_for(self, name: str) -> Manifest | None:
        """The highest generation committed under ``name``."""
        with self._lock:
            gens = [m for m in self._by_key.values() if m.name == name]
        return max(gens, key=lambda m: m.generation) if gens else None

    def names_key(self, key: str) -> bool:
        """Does a live manifest name ``key`` (committed objects are immutable)?"""
        with self._lock:
            return any(f.key == key for m in self._by_key.values() for f in m.files)

    def newest(self) -> Manifest | None:
        items = self.all()
        return items[0] if items else None

    def next_sequence(self) -> int:
        with self._lock:
            return self._max_sequence + 1
