"""Destination URL -> backend. Cloud SDKs are imported only when their scheme is used."""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Protocol

from sidecar.storage.base import Backend
from sidecar.storage.local import LocalBackend
from sidecar.storage.memory import MemoryBackend
from sidecar.storage.url import DestinationUrl, parse_destination

if TYPE_CHECKING:
    from sidecar.config import DestinationConfig

__all__ = ["open_backend"]


class _Factory(Protocol):
    def __call__(self, url: DestinationUrl, dest: DestinationConfig) -> Backend: ...


_MODULES = {"s3": "sidecar.storage.s3", "gs": "sidecar.storage.gcs", "az": "sidecar.storage.azure"}


def open_backend(dest: DestinationConfig) -> Backend:
    """Build the backend for ``dest.url``; raises ``DestinationUrlError`` or ``PermanentError``.

    Cloud modules expose ``create(url, dest) -> Backend``.
    """
    url = parse_destination(dest.url)
    if url.scheme == "file":
        assert url.path is not None
        return LocalBackend(url.path)
    if url.scheme == "memory":
        return MemoryBackend(url.bucket)
    module = importlib.import_module(_MODULES[url.scheme])
    factory: _Factory = module.create
    return factory(url, dest)
