"""Azure block uploads against Azurite: many blocks, verified CRC-64s, in-flight blocks bounded
for the whole backend, cancel."""

from __future__ import annotations

import concurrent.futures as cf
import os
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from azure.core.exceptions import ServiceResponseError
from azure.core.pipeline.transport import RequestsTransport
from azure.storage.blob import BlobServiceClient, ContainerClient, LinearRetry

from sidecar.storage.azure import AzureBackend
from sidecar.storage.azure_blocks import MAX_BLOCKS, block_size_for
from sidecar.storage.base import Cancelled, ChecksumMismatch, NotFound
from sidecar.storage.checksum import crc32c_of_bytes
from sidecar.storage.options import AzureOptions
from tests.servers.azurite import ACCOUNT, KEY, Azurite

MiB = 1024 * 1024


class WatchingTransport(RequestsTransport):  # type: ignore[misc]  # lazily exported, Any
    """The real HTTP transport, counting Put Block requests in flight (in all and per blob)
    and able to damage one: the ``corrupt_block``-th sent, or the first of blob
    ``corrupt_blob``. ``delay`` seconds before each Put Block keep blocks in flight long
    enough for uploads to overlap. ``break_block``: that Put Block reads 256 KiB of its body
    and fails as a dropped connection does."""

    def __init__(
        self,
        corrupt_block: int | None = None,
        corrupt_blob: str | None = None,
        delay: float = 0,
        break_block: int | None = None,
        corrupt_put_blob: bool = False,
    ) -> None:
        super().__init__()
        self.corrupt_put_blob = corrupt_put_blob
        self.puts: list[str] = []  # every PUT: "blob", "block" or "blocklist"
        self.corrupt_block = corrupt_block
        self.corrupt_blob = corrupt_blob
        self.delay = delay
        self.break_block = break_block
        self.blocks_sent = 0
        self.in_flight = 0
        self.max_in_flight = 0
        self.blobs_in_flight: dict[str, int] = {}
        self.max_blobs_in_flight = 0  # most blobs with a Put Block in flight at one time
        self._lock = threading.Lock()

    def send(self, request: Any, **kwargs: Any) -> Any:
        if request.method == "PUT" and "/ckpt/" in request.url:
            kind = "block" if "comp=block&" in request.url else "blob"
            self.puts.append("blocklist" if "comp=blocklist" in request.url else kind)
        if "comp=" not in request.url and request.method == "PUT" and self.corrupt_put_blob:
            self.corrupt_put_blob = False
            body = bytes(request.data)
            request.data = bytes([body[0] ^ 0xFF]) + body[1:]
        if "comp=block&" not in request.url:
            return super().send(request, **kwargs)
        blob = request.url.split("?", 1)[0].split("/ckpt/", 1)[-1]
        with self._lock:
            index = self.blocks_sent
            self.blocks_sent += 1
            self.in_flight += 1
            self.max_in_flight = max(self.max_in_flight, self.in_flight)
            self.blobs_in_flight[blob] = self.blobs_in_flight.get(blob, 0) + 1
            self.max_blobs_in_flight = max(self.max_blobs_in_flight, len(self.blobs_in_flight))
            corrupt = index == self.corrupt_block or blob == self.corrupt_blob
            broken = index == self.break_block
            if blob == self.corrupt_blob:
                self.corrupt_blob = None
        if corrupt:
            data = request.data  # a file over the block's buffer (BytesBody), or bytes
            body = bytes(data.read() if hasattr(data, "read") else data)
            request.data = bytes([body[0] ^ 0xFF]) + body[1:]  # one bit pattern flipped on the wire
        try:
            if broken:  # part of the body went out, then the connection dropped
                request.data.read(256 * 1024)
                raise ServiceResponseError("connection reset by peer (test)")
            time.sleep(self.delay)
            return super().send(request, **kwargs)
        finally:
            with self._lock:
                self.in_flight -= 1
                self.blobs_in_flight[blob] -= 1
                if not self.blobs_in_flight[blob]:
                    del self.blobs_in_flight[blob]


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
        retry_policy=LinearRetry(backoff=0, random_jitter_range=0, retry_total=2),
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


def test_block_cut_off_midway_is_sent_again_whole(
    azurite: Azurite, container: ContainerClient, tmp_path: Path
) -> None:
    data = os.urandom(5 * MiB + 3)
    (tmp_path / "w.bin").write_bytes(data)
    transport = WatchingTransport(break_block=2)
    backend = backend_with(azurite, container, transport, block_size_bytes=1 * MiB)
    info = backend.put_file("w.bin", tmp_path / "w.bin")
    assert transport.blocks_sent == 7  # six blocks, the third twice
    assert info.crc32c == crc32c_of_bytes(data)
    assert backend.get_bytes("w.bin") == data  # the retry sent the block from its start
    backend.close()


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


def test_file_of_one_block_goes_in_one_verified_put_blob(
    azurite: Azurite, container: ContainerClient, tmp_path: Path
) -> None:
    data = os.urandom(1 * MiB - 5)
    (tmp_path / "small.bin").write_bytes(data)
    transport = WatchingTransport()
    backend = backend_with(azurite, container, transport, block_size_bytes=1 * MiB)
    seen: list[int] = []
    info = backend.put_file("small.bin", tmp_path / "small.bin", progress=seen.append)
    assert transport.puts == ["blob"]  # one request, not a block and a block list
    assert (info.size, info.crc32c, seen) == (len(data), crc32c_of_bytes(data), [len(data)])
    assert backend.head("small.bin").crc32c == crc32c_of_bytes(data)
    assert backend.get_bytes("small.bin") == data
    (tmp_path / "two.bin").write_bytes(os.urandom(1 * MiB + 1))
    backend.put_file("two.bin", tmp_path / "two.bin")  # more than a block: blocks, as before
    assert transport.puts[1:] == ["block", "block", "blocklist"]


def test_one_put_blob_damaged_on_the_wire_is_rejected(
    azurite: Azurite, container: ContainerClient, tmp_path: Path
) -> None:
    (tmp_path / "small.bin").write_bytes(os.urandom(4096))
    transport = WatchingTransport(corrupt_put_blob=True)
    backend = backend_with(azurite, container, transport)
    with pytest.raises(ChecksumMismatch, match="Md5Mismatch"):
        backend.put_file("small.bin", tmp_path / "small.bin")
    with pytest.raises(NotFound):
        backend.head("small.bin")
    backend.put_file("small.bin", tmp_path / "small.bin")  # sent again, undamaged: stored
    assert backend.get_bytes("small.bin") == (tmp_path / "small.bin").read_bytes()


def test_cancelled_put_blob_leaves_the_old_blob(
    azurite: Azurite, container: ContainerClient, tmp_path: Path
) -> None:
    (tmp_path / "small.bin").write_bytes(b"new bytes")
    transport = WatchingTransport()
    backend = backend_with(azurite, container, transport)
    backend.put_bytes("small.bin", b"previous checkpoint")
    transport.puts.clear()

    def cancel(n: int) -> None:
        raise Cancelled("drain chose another checkpoint")

    with pytest.raises(Cancelled):
        backend.put_file("small.bin", tmp_path / "small.bin", progress=cancel)
    assert transport.puts == []  # told before anything was sent
    assert backend.get_bytes("small.bin") == b"previous checkpoint"


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


def put_at_once(backend: AzureBackend, files: dict[str, Path]) -> dict[str, Any]:
    """``put_file`` of every file, each from its own thread, all started together; the
    ObjectInfo or the exception of each key."""
    start = threading.Barrier(len(files))

    def put(key: str, path: Path) -> Any:
        start.wait()
        return backend.put_file(key, path)

    with cf.ThreadPoolExecutor(len(files)) as pool:
        futures = {key: pool.submit(put, key, path) for key, path in files.items()}
        cf.wait(futures.values())
    return {key: f.exception() or f.result() for key, f in futures.items()}


def test_blocks_in_flight_bounded_for_the_whole_backend(
    azurite: Azurite, container: ContainerClient, tmp_path: Path
) -> None:
    data = {"a.pt": os.urandom(8 * MiB + 5), "b.pt": os.urandom(7 * MiB)}
    for name, body in data.items():
        (tmp_path / name).write_bytes(body)
    transport = WatchingTransport(delay=0.05)
    backend = backend_with(
        azurite, container, transport, block_size_bytes=1 * MiB, max_concurrency=3
    )
    try:
        out = put_at_once(backend, {name: tmp_path / name for name in data})
        for name, body in data.items():
            assert out[name].crc32c == crc32c_of_bytes(body)
            assert backend.get_bytes(name) == body
    finally:
        backend.close()
    assert transport.max_blobs_in_flight == 2  # the two uploads did overlap
    assert 1 < transport.max_in_flight <= 3  # 3 for both files together, not 3 each


def test_failed_block_cancels_only_its_own_file(
    azurite: Azurite, container: ContainerClient, tmp_path: Path
) -> None:
    good = os.urandom(12 * MiB)
    (tmp_path / "good.pt").write_bytes(good)
    (tmp_path / "bad.pt").write_bytes(os.urandom(6 * MiB))
    transport = WatchingTransport(corrupt_blob="bad.pt", delay=0.05)
    backend = backend_with(
        azurite, container, transport, block_size_bytes=1 * MiB, max_concurrency=2
    )
    try:
        out = put_at_once(backend, {"good.pt": tmp_path / "good.pt", "bad.pt": tmp_path / "bad.pt"})
        assert isinstance(out["bad.pt"], ChecksumMismatch)
        assert out["good.pt"].crc32c == crc32c_of_bytes(good)
        assert backend.get_bytes("good.pt") == good
        with pytest.raises(NotFound):
            backend.head("bad.pt")
        # the backend's budget and threads still serve uploads after the failure
        backend.put_file("again.pt", tmp_path / "good.pt")
        assert backend.get_bytes("again.pt") == good
    finally:
        backend.close()
    assert transport.max_blobs_in_flight == 2
