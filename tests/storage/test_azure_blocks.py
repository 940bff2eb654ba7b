"""Azure block uploads against Azurite: many blocks, verified CRC-64s, bounded in-flight, cancel."""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from azure.core.pipeline.transport import RequestsTransport
from azure.storage.blob import BlobServiceClient, ContainerClient

from sidecar.storage.azure import AzureBackend
from sidecar.storage.azure_blocks import MAX_BLOCKS, block_size_for
from sidecar.storage.base import Cancelled, ChecksumMismatch, NotFound
from sidecar.storage.checksum import crc32c_of_bytes
from sidecar.storage.options import AzureOptions
from tests.servers.azurite import ACCOUNT, KEY, Azurite

MiB = 1024 * 1024


class WatchingTransport(RequestsTransport):  # type: ignore[misc]  # lazily exported, Any
    """The real HTTP transport, counting Put Block requests in flight and able to damage one."""

    def __init__(self, corrupt_block: int | None = None) -> None:
        super().__init__()
        self.corrupt_block = corrupt_block
        self.blocks_sent = 0
        self.in_flight = 0
        self.max_in_flight = 0
        self._lock = threading.Lock()

    def send(self, request: Any, **kwargs: Any) -> Any:
        if "comp=block&" not in request.url:
            return super().send(request, **kwargs)
        with self._lock:
            index = self.blocks_sent
            self.blocks_sent += 1
            self.in_flight += 1
            self.max_in_flight = max(self.max_in_flight, self.in_flight)
        if index == self.corrupt_block:
            body = bytes(request.data)
            request.data = bytes([body[0] ^ 0xFF]) + body[1:]  # one bit pattern flipped on the wire
        try:
            return super().send(request, **kwargs)
        finally:
            with self._lock:
                self.in_flight -= 1


@pytest.fixture
def container(azurite: Azurite) -> Iterator[ContainerClient]:
    name = azurite.new_container()
    with azurite.service() as service:
        yield service.get_container_client(name)
    azurite.delete_container(name)


def backend_with(
    azurite: Azurite, container: ContainerClient, transport: RequestsTransport, **opts: Any
) -> AzureBackend:
    service = BlobServiceClient(
        azurite.account_url,
        credential={"account_name": ACCOUNT, "account_key": KEY},
        transport=transport,
    )
    client = service.get_container_client(container.container_name)
    return AzureBackend(client, "ckpt", AzureOptions(**opts), account=ACCOUNT)


def test_file_of_many_blocks(azurite: Azurite, container: ContainerClient, tmp_path: Path) -> None:
    data = os.urandom(24 * MiB + 777)
    (tmp_path / "model.pt").write_bytes(data)
    transport = WatchingTransport()
    backend = backend_with(
        azurite, container, transport, block_size_bytes=1 * MiB, max_concurrency=3
    )
    seen: list[int] = []
    info = backend.put_file("step-9/model.pt", tmp_path / "model.pt", progress=seen.append)

    assert info.size == len(data)
    assert info.crc32c == crc32c_of_bytes(data)
    committed, uncommitted = container.get_blob_client("ckpt/step-9/model.pt").get_block_list()
    assert [b.size for b in committed] == [MiB] * 24 + [777]
    assert uncommitted == []
    assert sorted(seen) == sorted(b.size for b in committed)  # one call per block, any order
    assert 1 < transport.max_in_flight <= 3
    assert backend.head("step-9/model.pt").crc32c == crc32c_of_bytes(data)
    assert backend.get_bytes("step-9/model.pt") == data


def test_block_damaged_on_the_wire_is_rejected(
    azurite: Azurite, container: ContainerClient, tmp_path: Path
) -> None:
    (tmp_path / "w.bin").write_bytes(os.urandom(5 * MiB))
    backend = backend_with(
        azurite, container, WatchingTransport(corrupt_block=2), block_size_bytes=1 * MiB
    )
    with pytest.raises(ChecksumMismatch, match="Crc64Mismatch"):
        backend.put_file("w.bin", tmp_path / "w.bin")
    with pytest.raises(NotFound):
        backend.head("w.bin")


def test_cancel_commits_nothing_and_keeps_old_blob(
    azurite: Azurite, container: ContainerClient, tmp_path: Path
) -> None:
    backend = backend_with(
        azurite, container, WatchingTransport(), block_size_bytes=1 * MiB, max_concurrency=2
    )
    backend.put_bytes("last.ckpt", b"previous checkpoint")
    (tmp_path / "last.ckpt").write_bytes(os.urandom(8 * MiB))
    calls = 0

    def cancel_on_third_block(n: int) -> None:
        nonlocal calls
        calls += 1
        if calls == 3:
            raise Cancelled("drain chose another checkpoint")

    with pytest.raises(Cancelled):
        backend.put_file("last.ckpt", tmp_path / "last.ckpt", progress=cancel_on_third_block)
    blob = container.get_blob_client("ckpt/last.ckpt")
    _, uncommitted = blob.get_block_list("all")
    assert len(uncommitted) >= 3  # the service holds the staged blocks, uncommitted
    assert backend.get_bytes("last.ckpt") == b"previous checkpoint"
    assert [o.key for o in backend.list("")] == ["last.ckpt"]


def test_block_size_grows_to_fit_the_service_limit() -> None:
    assert block_size_for(10 * MiB, 8 * MiB) == 8 * MiB
    huge = 8 * MiB * MAX_BLOCKS + 1
    size = block_size_for(huge, 8 * MiB)
    assert size % MiB == 0
    assert -(-huge // size) <= MAX_BLOCKS
