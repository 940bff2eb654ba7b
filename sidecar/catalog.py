"""The destination's committed checkpoints, as read from its manifests.

A cache of what ``.ckpt-sidecar/manifests/`` holds; the daemon updates it as it commits and
deletes. Manifests that do not parse are reported and left alone (never trusted).
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable

import structlog

from sidecar.manifest import LATEST_KEY, MANIFEST_PREFIX, Manifest, ManifestError, parse
from sidecar.storage.base import Backend, NotFound

__all__ = ["Catalog"]

log = structlog.get_logger("sidecar.catalog")


class Catalog:
    """Thread-safe view of committed manifests, keyed by manifest key."""

    def __init__(self) -> None:
        self._by_key: dict[str, Manifest] = {}
        self._lock = threading.Lock()
        self._max_sequence = -1

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
        interrupted listing) and raise the sequence floor to ``LATEST``'s. Returns ``self``."""
        for info in backend.list(MANIFEST_PREFIX):
            if not info.key.endswith(".json"):
                continue
            try:
                m = parse(backend.get_bytes(info.key), where=info.key)
            except NotFound:
                continue
            except ManifestError as e:
                if on_invalid:
                    on_invalid(info.key, str(e))
                continue
            if m.key != info.key:
                if on_invalid:
                    on_invalid(info.key, f"names {m.name!r} generation {m.generation}")
                continue
            self.add(m)
        try:
            latest = json.loads(backend.get_bytes(LATEST_KEY))
            seq = latest.get("sequence") if isinstance(latest, dict) else None
            if isinstance(seq, int):
                self.add_sequence_floor(seq)
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
