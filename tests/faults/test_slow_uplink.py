"""A slow uplink: request bodies that take longer to go up than the connect timeout still
arrive, on S3 (SeaweedFS) and Azure (Azurite), whole files and parts alike.

urllib3 sent a ``bytes`` body with one ``sendall``, bounded on a new connection by the connect
timeout (10 s in the daemon), so over a link that gave a connection less than 0.8 MiB/s every
8 MiB part was closed unanswered, sent again and closed again: the upload never finished and
a drain over S3 or Azure missed its deadline with half of it to spare (bench/drain.md).

Here the connect timeout is 1 s and the uplink 4 MiB/s for all connections together, so
every body below takes about 1.7-3 s to go up, and each block of ``body.BLOCK`` (1 MiB)
0.25-0.5 s (less where the sockets' buffers take part of it at once).
S3 makes one attempt per request; Azure keeps its retries, each of which was cut off the
same way.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlsplit

import pytest

from sidecar.storage import azure_client, s3_client
from sidecar.storage.azure import create as create_azure
from sidecar.storage.base import Backend
from sidecar.storage.checksum import crc32c_of_file
from sidecar.storage.options import S3Options
from sidecar.storage.s3 import S3Backend
from sidecar.storage.url import parse_destination
from tests.servers.azurite import Azurite
from tests.servers.faultproxy import FaultProxy
from tests.servers.seaweedfs import S3Server, new_bucket

MiB = 1024 * 1024
UPLINK = 4 * MiB
CONNECT_TIMEOUT = 1.0


def _proxy(host: str, port: int) -> FaultProxy:
    proxy = FaultProxy(host, port)
    proxy.set(rate=UPLINK)
    return proxy


@pytest.fixture
def files(tmp_path: Path) -> dict[str, Path]:
    """A 7 MiB file (one request) and a 12 MiB one (two parts or blocks). Bodies this large
    do not fit in the loopback sockets' buffers, which would take them at once."""
    out = {}
    for name, size in (("small.bin", 7 * MiB), ("large.bin", 12 * MiB)):
        out[name] = tmp_path / name
        out[name].write_bytes(os.urandom(size))
    return out


def _upload_all(backend: Backend, files: dict[str, Path]) -> None:
    """Each file goes up and the store holds it whole, with its CRC32C."""
    for name, path in files.items():
        size, crc = path.stat().st_size, crc32c_of_file(path)
        info = backend.put_file(name, path)
        stored = backend.head(name)
        assert (info.size, info.crc32c) == (size, crc)
        assert (stored.size, stored.crc32c) == (size, crc)


@pytest.fixture
def slow_s3(s3_server: S3Server, monkeypatch: pytest.MonkeyPatch) -> Iterator[S3Backend]:
    monkeypatch.setattr(s3_client, "CONNECT_TIMEOUT_SECONDS", CONNECT_TIMEOUT)
    for key, value in s3_server.env().items():
        monkeypatch.setenv(key, value)
    monkeypatch.setenv("AWS_MAX_ATTEMPTS", "1")
    u = urlsplit(s3_server.endpoint_url)
    assert u.hostname and u.port
    proxy = _proxy(u.hostname, u.port)
    backend = S3Backend(
        new_bucket(s3_server, "slow"),
        "run",
        S3Options(
            endpoint_url=proxy.url,
            region=s3_server.region,
            addressing_style="path",
            multipart_threshold_bytes=8 * MiB,
            part_size_bytes=8 * MiB,
            part_concurrency=2,
        ),
    )
    yield backend
    backend.close()
    proxy.close()


def test_s3_bodies_slower_than_the_connect_timeout_arrive(
    slow_s3: S3Backend, files: dict[str, Path]
) -> None:
    _upload_all(slow_s3, files)


@pytest.fixture
def slow_azure(azurite: Azurite, monkeypatch: pytest.MonkeyPatch) -> Iterator[Backend]:
    monkeypatch.setattr(azure_client, "CONNECT_TIMEOUT_SECONDS", CONNECT_TIMEOUT)
    proxy = _proxy("127.0.0.1", azurite.port)
    container = azurite.new_container()
    dest = azurite.destination(
        f"az://{container}/run",
        account_url=proxy.url + urlsplit(azurite.account_url).path,
        block_size_bytes=8 * MiB,
        max_concurrency=2,
    )
    backend = create_azure(parse_destination(dest.url), dest)
    yield backend
    backend.close()
    proxy.close()
    azurite.delete_container(container)


def test_azure_bodies_slower_than_the_connect_timeout_arrive(
    slow_azure: Backend, files: dict[str, Path]
) -> None:
    _upload_all(slow_azure, files)
