"""A requests adapter whose ``bytes`` and ``memoryview`` bodies go up in blocks (see
``sidecar.storage.body`` for why: a socket timeout then bounds each block, not the whole
body). Used by the GCS and Azure clients; kept apart so the S3 path does not import
requests."""

from __future__ import annotations

from typing import Any

from requests import PreparedRequest, Response
from requests.adapters import HTTPAdapter
from urllib3.poolmanager import PoolKey

from sidecar.storage.body import BLOCK, BytesBody

__all__ = ["BlockwiseAdapter"]


class BlockwiseAdapter(HTTPAdapter):
    """A requests adapter that sends ``bytes`` and ``memoryview`` bodies as
    :class:`BytesBody`, in sends of :data:`BLOCK` bytes (where urllib3 takes a block size),
    a new one for every send."""

    def init_poolmanager(
        self, connections: int, maxsize: int, block: bool = False, **pool_kwargs: Any
    ) -> None:
        if hasattr(PoolKey, "key_blocksize"):  # urllib3 2
            pool_kwargs.setdefault("blocksize", BLOCK)
        super().init_poolmanager(connections, maxsize, block, **pool_kwargs)

    def send(self, request: PreparedRequest, *args: Any, **kwargs: Any) -> Response:
        """Send ``request``; its ``body`` is the same ``bytes`` or ``memoryview`` again
        afterwards (a redirect or a caller that sends it again sees the whole body, not a
        read-out file)."""
        body: object = request.body
        if not isinstance(body, bytes | memoryview):
            return super().send(request, *args, **kwargs)
        request.body = BytesBody(body)  # type: ignore[assignment]
        try:
            return super().send(request, *args, **kwargs)
        finally:
            request.body = body  # type: ignore[assignment]  # a memoryview, as it came
