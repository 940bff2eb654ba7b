"""Small helpers of the GCS backend: object resources -> ObjectInfo, a checksumming writer."""

from __future__ import annotations

from datetime import datetime
from typing import Any, BinaryIO

from sidecar.storage.base import ObjectInfo, Progress
from sidecar.storage.checksum import Crc32c

__all__ = ["PROGRESS_STEP", "CrcWriter", "info_of", "resource_of"]

#: downloads report progress in steps of about this many bytes
PROGRESS_STEP = 1024 * 1024


def info_of(key: str, resource: dict[str, Any]) -> ObjectInfo:
    """ObjectInfo from a JSON API object resource (``size``, ``crc32c``, ``updated``)."""
    updated = resource.get("updated")
    mtime = datetime.fromisoformat(updated).timestamp() if isinstance(updated, str) else None
    return ObjectInfo(
        key=key, size=int(resource.get("size") or 0), crc32c=resource.get("crc32c"), mtime=mtime
    )


def resource_of(blob: Any) -> dict[str, Any]:
    """The fields :func:`info_of` reads, from a ``google.cloud.storage.Blob``'s properties."""
    updated = blob.updated
    return {
        "size": blob.size,
        "crc32c": blob.crc32c,
        "generation": blob.generation,
        "updated": updated.isoformat() if updated is not None else None,
    }


class CrcWriter:
    """Write-through file wrapper: CRC32C and size of what was written, batched progress."""

    def __init__(self, out: BinaryIO, progress: Progress | None) -> None:
        self._out = out
        self._progress = progress
        self._unreported = 0
        self.crc = Crc32c()
        self.size = 0

    def write(self, data: bytes) -> int:
        data = bytes(data)
        self.crc.update(data)
        self._out.write(data)
        self.size += len(data)
        self._unreported += len(data)
        if self._unreported >= PROGRESS_STEP:
            self.flush_progress()
        return len(data)

    def flush_progress(self) -> None:
        if self._progress is not None and self._unreported:
            self._progress(self._unreported)
        self._unreported = 0
