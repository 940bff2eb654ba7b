"""Azure create-only writes and server-side copy, against Azurite."""

from __future__ import annotations

import concurrent.futures
import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from sidecar.storage.azure import AzureBackend, create
from sidecar.storage.azure_copy import wait_for_copy
from sidecar.storage.base import (
    AlreadyExists,
    NotFound,
    PermanentError,
    StorageError,
    TransientError,
)
from sidecar.storage.checksum import crc32c_of_bytes
from sidecar.storage.url import parse_destination
from tests.servers.azurite import Azurite

MiB = 1024 * 1024


@pytest.fixture
def backend(azurite: Azurite) -> Iterator[AzureBackend]:
    container = azurite.new_container()
    dest = azurite.destination(f"az://{container}/job", block_size_bytes=2 * MiB)
    b = create(parse_destination(dest.url), dest)
    assert isinstance(b, AzureBackend)
    yield b
    b.close()
    azurite.delete_container(container)


def test_create_only_manifest_conflict(backend: AzureBackend) -> None:
    key = ".ckpt-sidecar/manifests/step-100.json"
    backend.put_bytes(key, b'{"writer": "node-0"}', create_only=True)

    def second_writer(i: int) -> str:
        try:
            backend.put_bytes(key, f'{{"writer": "node-{i}"}}'.encode(), create_only=True)
        except AlreadyExists as e:
            return str(e)
        return "won"

    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        outcomes = list(pool.map(second_writer, range(1, 5)))
    assert all("already exists" in o and "step-100.json" in o for o in outcomes)
    assert backend.get_bytes(key) == b'{"writer": "node-0"}'
    assert backend.head(key).crc32c == crc32c_of_bytes(b'{"writer": "node-0"}')


def test_unchanged_file_copied_server_side(
    backend: AzureBackend, azurite: Azurite, tmp_path: Path
) -> None:
    data = os.urandom(9 * MiB + 5)  # five blocks
    (tmp_path / "optim.pt").write_bytes(data)
    put = backend.put_file("step-1/optim.pt", tmp_path / "optim.pt")

    info = backend.copy("step-1/optim.pt", "step-2/optim.pt")

    assert info.size == len(data)
    assert info.crc32c == put.crc32c  # the CRC32C metadata travels with the copy
    with azurite.service() as service:
        blob = service.get_blob_client(backend.container_name, "job/step-2/optim.pt")
        props = blob.get_blob_properties()
    assert props.copy.status == "success"
    assert str(props.copy.source).endswith("/job/step-1/optim.pt")  # the service copied it
    assert backend.get_bytes("step-2/optim.pt") == data


def test_copy_of_missing_source_is_not_found(backend: AzureBackend) -> None:
    with pytest.raises(NotFound, match=r"step-0/gone\.pt"):
        backend.copy("step-0/gone.pt", "step-1/gone.pt")
    with pytest.raises(NotFound):
        backend.head("step-1/gone.pt")


def test_no_copy_that_would_drop_the_encryption_scope(azurite: Azurite) -> None:
    dest = azurite.destination("az://ckpt/job", encryption_scope="checkpoints")
    backend = create(parse_destination(dest.url), dest)
    with pytest.raises(StorageError, match="encryption scope") as err:
        backend.copy("step-1/optim.pt", "step-2/optim.pt")  # the caller uploads instead
    assert not isinstance(err.value, NotFound | PermanentError)


class _Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds


def test_pending_copy_polled_to_completion() -> None:
    # Azurite finishes every copy before it answers, so the service's "pending" answers
    # for a large blob are played here to exercise the polling loop.
    answers = iter(["pending", "pending", "pending", "success"])
    clock = _Clock()
    aborted: list[bool] = []
    wait_for_copy(
        "pending",
        lambda: next(answers),
        lambda: aborted.append(True),
        what="copy",
        timeout=60,
        clock=clock,
        sleep=clock.sleep,
    )
    assert aborted == []
    assert next(answers, None) is None  # polled until the service said success


def test_copy_still_pending_at_timeout_is_aborted() -> None:
    clock = _Clock()
    aborted: list[bool] = []
    with pytest.raises(TransientError, match="aborted"):
        wait_for_copy(
            "pending",
            lambda: "pending",
            lambda: aborted.append(True),
            what="copy",
            timeout=30,
            clock=clock,
            sleep=clock.sleep,
        )
    assert aborted == [True]
    assert 30 <= clock.now < 33


def test_failed_copy_is_reported() -> None:
    with pytest.raises(TransientError, match="failed"):
        wait_for_copy("failed", lambda: None, lambda: None, what="copy", timeout=1)
