"""Request bodies go to the socket in blocks of 1 MiB (``body.BLOCK``) on S3 and Azure: each
send has the socket timeout to itself (see ``sidecar.storage.body``), and fewer, larger
sends cost less CPU than botocore's 128 KiB (bench/s3.md)."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from sidecar.storage.azure import create as create_azure
from sidecar.storage.base import Backend
from sidecar.storage.body import BytesBody
from sidecar.storage.checksum import crc32c_of_file
from sidecar.storage.url import parse_destination
from tests.conformance.test_s3 import MiB, s3_backend
from tests.servers.azurite import Azurite
from tests.servers.seaweedfs import S3Server, new_bucket


@pytest.fixture
def reads(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The size asked of every ``BytesBody.read`` while the test runs."""
    asked: list[int] = []
    read = BytesBody.read

    def recording(self: BytesBody, size: int | None = -1) -> memoryview:
        asked.append(-1 if size is None else size)
        return read(self, size)

    monkeypatch.setattr(BytesBody, "read", recording)
    return asked


@pytest.fixture
def model(tmp_path: Path) -> Path:
    """Two 5 MiB parts or blocks and a short last one."""
    path = tmp_path / "model.bin"
    path.write_bytes(os.urandom(2 * 5 * MiB + 777))
    return path


def _sent_whole(backend: Backend, model: Path) -> None:
    info = backend.put_file("model.bin", model)
    assert info.crc32c == crc32c_of_file(model)
    assert backend.head("model.bin").crc32c == info.crc32c


def test_s3_parts_are_sent_in_blocks(s3_env: S3Server, model: Path, reads: list[int]) -> None:
    backend = s3_backend(s3_env, new_bucket(s3_env))
    try:
        _sent_whole(backend, model)
    finally:
        backend.close()
    assert reads and set(reads) == {MiB}


@pytest.fixture
def azure(azurite: Azurite) -> Iterator[Backend]:
    container = azurite.new_container()
    dest = azurite.destination(f"az://{container}/run", block_size_bytes=5 * MiB)
    backend = create_azure(parse_destination(dest.url), dest)
    yield backend
    backend.close()
    azurite.delete_container(container)


def test_azure_blocks_are_sent_in_blocks(azure: Backend, model: Path, reads: list[int]) -> None:
    _sent_whole(azure, model)
    assert reads and set(reads) == {MiB}
