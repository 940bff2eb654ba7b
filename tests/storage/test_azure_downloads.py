"""Azure downloads against Azurite, through the client the daemon and restore build, seen
through a recording proxy: what each GET asks for and how many run at once."""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from sidecar.storage.azure import AzureBackend, create
from sidecar.storage.azure_client import DOWNLOAD_GET_BYTES
from sidecar.storage.checksum import crc32c_of_bytes
from sidecar.storage.url import parse_destination
from tests.servers.azurite import ACCOUNT, Azurite
from tests.servers.seaweedfs import S3Proxy
from tests.storage.replaced import assert_a_replacement_midway_fails_the_download

MiB = 1024 * 1024


@pytest.fixture
def proxy(azurite: Azurite) -> Iterator[S3Proxy]:
    """The same recording proxy the S3 tests use, in front of Azurite (Shared Key signs the
    path, which the proxy keeps)."""
    p = S3Proxy(f"http://127.0.0.1:{azurite.port}")
    yield p
    p.close()


def backend_via(azurite: Azurite, proxy: S3Proxy, **options: object) -> AzureBackend:
    container = azurite.new_container()
    dest = azurite.destination(
        f"az://{container}/ckpt", account_url=f"{proxy.endpoint_url}/{ACCOUNT}", **options
    )
    backend = create(parse_destination(dest.url), dest)
    assert isinstance(backend, AzureBackend)
    return backend


def ranges(proxy: S3Proxy) -> list[tuple[int, int]]:
    """``(first, last)`` of every GET the proxy saw, in the order they were sent."""
    out = []
    for r in proxy.requests:
        if r.method == "GET":
            first, _, last = r.headers["x-ms-range"].removeprefix("bytes=").partition("-")
            out.append((int(first), int(last)))
    return out


def test_a_large_blob_comes_down_in_ranges_pinned_to_its_etag(
    azurite: Azurite, proxy: S3Proxy, tmp_path: Path
) -> None:
    """The SDK's first GET would be 32 MiB, received whole (a restore of 100 files peaked at
    518 MB of RSS with it before a07fe92); every GET asks for at most 4 MiB, and every one
    after the first (which learns the ETag) carries ``If-Match``, at most
    ``max_concurrency`` at once."""
    backend = backend_via(azurite, proxy, max_concurrency=3)
    data = os.urandom(2 * DOWNLOAD_GET_BYTES + 5 * MiB + 7)
    src = tmp_path / "model.pt"
    src.write_bytes(data)
    backend.put_file("model.pt", src)
    before = len(proxy.requests)
    seen: list[int] = []
    info = backend.get_file("model.pt", tmp_path / "restored.pt", progress=seen.append)
    backend.close()
    assert (tmp_path / "restored.pt").read_bytes() == data
    assert info.crc32c == crc32c_of_bytes(data) and info.size == len(data)
    assert sum(seen) == len(data)
    gets = [r for r in proxy.requests[before:] if r.method == "GET"]
    step = DOWNLOAD_GET_BYTES
    assert sorted(ranges(proxy)) == [
        (0, step - 1),
        (step, 2 * step - 1),
        (2 * step, 3 * step - 1),
        (3 * step, len(data) - 1),
    ]
    assert "If-Match" not in gets[0].headers
    assert all(r.headers.get("If-Match") for r in gets[1:])
    assert len({r.headers["If-Match"] for r in gets[1:]}) == 1
    assert proxy.max_in_flight("/model.pt") <= 3


def test_a_blob_replaced_during_the_download_fails_it(
    azurite: Azurite, proxy: S3Proxy, tmp_path: Path
) -> None:
    """One range at a time (``max_concurrency=1``): the first range is reported, the blob is
    replaced, and the next ranged GET finds another ETag. Nothing of the two versions is
    left mixed in the file."""
    backend = backend_via(azurite, proxy, max_concurrency=1)
    src = tmp_path / "model.pt"
    src.write_bytes(os.urandom(DOWNLOAD_GET_BYTES + MiB))
    backend.put_file("model.pt", src)
    assert_a_replacement_midway_fails_the_download(
        backend, "model.pt", tmp_path / "restored.pt", match="replaced during the download"
    )
    backend.close()
    assert [r.status for r in proxy.requests if r.method == "GET"] == [206, 412]


def test_a_blob_of_one_get_comes_down_in_one(
    azurite: Azurite, proxy: S3Proxy, tmp_path: Path
) -> None:
    backend = backend_via(azurite, proxy)
    data = os.urandom(DOWNLOAD_GET_BYTES)
    src = tmp_path / "small.pt"
    src.write_bytes(data)
    backend.put_file("small.pt", src)
    info = backend.get_file("small.pt", tmp_path / "restored.pt")
    backend.close()
    assert (tmp_path / "restored.pt").read_bytes() == data
    assert info.crc32c == crc32c_of_bytes(data)
    assert ranges(proxy) == [(0, DOWNLOAD_GET_BYTES - 1)]


def test_the_ranges_go_at_once(azurite: Azurite, proxy: S3Proxy, tmp_path: Path) -> None:
    """Two ranged GETs are at the proxy together: the second is sent while the first is held
    there unanswered (one GET after another, it would wait for the first)."""
    backend = backend_via(azurite, proxy, max_concurrency=3)
    data = os.urandom(3 * DOWNLOAD_GET_BYTES + 1)
    src = tmp_path / "model.pt"
    src.write_bytes(data)
    backend.put_file("model.pt", src)
    initial, one, another = (proxy.hold("/model.pt") for _ in range(3))
    done: list[object] = []
    worker = threading.Thread(
        target=lambda: done.append(backend.get_file("model.pt", tmp_path / "restored.pt"))
    )
    worker.start()
    try:
        initial.wait()
        initial.release(forward=True)
        one.wait()
        another.wait(timeout=10)
    finally:
        for h in (one, another):
            if h.reached.is_set():
                h.release(forward=True)
        worker.join(60)
        backend.close()
    assert done and (tmp_path / "restored.pt").read_bytes() == data
