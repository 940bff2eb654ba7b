"""Small helpers of the GCS backend: object resources -> ObjectInfo."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sidecar.storage.base import ObjectInfo

__all__ = ["info_of", "resource_of"]


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
