"""An in-memory backend for unit tests; passes the conformance suite."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import ClassVar

from sidecar.storage.base import (
    AlreadyExists,
    Backend,
    NotFound,
    ObjectInfo,
    Progress,
)
from sidecar.storage.checksum import Crc32c, crc32c_of_bytes, read_chunks
from sidecar.storage.keys import check_key
from sidecar.storage.source import open_source

__all__ = ["MemoryBackend"]


class MemoryBackend(Backend):
    """Objects live in a dict; ``memory://name`` URLs with the same name share one store."""

    scheme = "memory"
    _stores: ClassVar[dict[str, dict[str, tuple[bytes, float]]]] = {}
    _stores_lock = threading.Lock()

    def __init__(self, name: str = "default") -> None:
        self._name = name
        with self._stores_lock:
            self._objects = self._stores.setdefault(name, {})
        self._lock = threading.Lock()

    @property
    def url(self) -> str:
        return f"memory://{self._name}"

    def _info(self, key: str, data: bytes, mtime: float) -> ObjectInfo:
        return ObjectInfo(key=key, size=len(data), crc32c=crc32c_of_bytes(data), mtime=mtime)

    def put_file(self, key: str, path: Path, *, progress: Progress | None = None) -> ObjectInfo:
        check_key(key)
        buf = bytearray()
        crc = Crc32c()
        with open_source(path) as f:
            for chunk in read_chunks(f):
                crc.update(chunk)
                buf += chunk
                if progress:
                    progress(len(chunk))
        now = time.time()
        with self._lock:
            self._objects[key] = (bytes(buf), now)
        return ObjectInfo(key=key, size=len(buf), crc32c=crc.b64(), mtime=now)

    def put_bytes(self, key: str, data: bytes, *, create_only: bool = False) -> ObjectInfo:
        check_key(key)
        now = time.time()
        with self._lock:
            if create_only and key in self._objects:
                raise AlreadyExists(key)
            self._objects[key] = (bytes(data), now)
        return self._info(key, data, now)

    def _get(self, key: str) -> tuple[bytes, float]:
        with self._lock:
            try:
                return self._objects[key]
            except KeyError:
                raise NotFound(key) from None

    def get_file(self, key: str, path: Path, *, progress: Progress | None = None) -> ObjectInfo:
        data, mtime = self._get(key)
        with open(path, "wb") as f:
            f.write(data)
        if progress:
            progress(len(data))
        return self._info(key, data, mtime)

    def get_bytes(self, key: str) -> bytes:
        return self._get(key)[0]

    def head(self, key: str) -> ObjectInfo:
        data, mtime = self._get(key)
        return self._info(key, data, mtime)

    def list(self, prefix: str = "") -> Iterator[ObjectInfo]:
        with self._lock:
            items = [(k, v) for k, v in self._objects.items() if k.startswith(prefix)]
        for k, (data, mtime) in items:
            yield self._info(k, data, mtime)

    def delete(self, key: str) -> None:
        with self._lock:
            self._objects.pop(key, None)

    def copy(self, src: str, dst: str) -> ObjectInfo:
        check_key(dst)
        data, _ = self._get(src)
        now = time.time()
        with self._lock:
            self._objects[dst] = (data, now)
        return self._info(dst, data, now)
