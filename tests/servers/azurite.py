"""Azurite (Microsoft's Azure Storage emulator, from npm) for the Azure Blob tests.

``azurite-blob`` comes from ``node_modules/.bin`` (``npm ci`` at the repository root
installs the version pinned in ``package-lock.json``) or the PATH. It listens on a free
loopback port with in-memory persistence and no telemetry; :func:`start_azurite` returns
once it answers HTTP and stops it on exit. A server that cannot start fails the test.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import shutil
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from azure.storage.blob import BlobServiceClient

from sidecar.config import DestinationConfig
from sidecar.storage.options import AzureOptions
from tests.servers.ports import answers, free_port

__all__ = ["ACCOUNT", "KEY", "Azurite", "azurite", "azurite_binary", "start_azurite"]

#: Azurite's built-in development account and its published key (not a secret).
ACCOUNT = "devstoreaccount1"
KEY = "Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw=="
_REPO = Path(__file__).resolve().parents[2]
_names = itertools.count()


@dataclass(frozen=True)
class Azurite:
    """A running Azurite blob service (``pid`` is its process, for measurements)."""

    port: int
    pid: int = 0

    @property
    def account_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/{ACCOUNT}"

    @property
    def connection_string(self) -> str:
        return (
            f"DefaultEndpointsProtocol=http;AccountName={ACCOUNT};AccountKey={KEY};"
            f"BlobEndpoint={self.account_url};"
        )

    def service(self) -> BlobServiceClient:
        return BlobServiceClient(
            self.account_url, credential={"account_name": ACCOUNT, "account_key": KEY}
        )

    def new_container(self) -> str:
        """Create a fresh, empty container and return its name."""
        name = f"t{os.getpid()}-{next(_names):05d}"
        with self.service() as service:
            service.create_container(name)
        return name

    def delete_container(self, name: str) -> None:
        with self.service() as service:
            service.delete_container(name)

    def destination(self, url: str, **options: Any) -> DestinationConfig:
        """A destination config for ``url`` on this server, with the development key."""
        fields: dict[str, Any] = {"account_url": self.account_url, "account_key": KEY}
        fields.update(options)
        return DestinationConfig(url=url, azure=AzureOptions(**fields))


def azurite_binary() -> str:
    """Path of ``azurite-blob``; fails the test with the fix when it is not installed."""
    local = _REPO / "node_modules" / ".bin" / "azurite-blob"
    if local.exists():
        return str(local)
    found = shutil.which("azurite-blob")
    if found:
        return found
    pytest.fail(
        "azurite-blob not found: run `npm ci` at the repository root (Node.js 20+) to install "
        "the Azurite version pinned in package-lock.json",
        pytrace=False,
    )


@contextlib.contextmanager
def start_azurite(
    workdir: Path, *, memory_limit_mb: int = 2048, on_disk: bool = False
) -> Iterator[Azurite]:
    """Run ``azurite-blob`` in ``workdir`` until the block exits; fail if it does not answer.

    Blobs are kept in memory, at most ``memory_limit_mb``; ``on_disk`` keeps them in
    ``workdir/azurite`` instead (``--location``), for uploads larger than memory."""
    workdir.mkdir(parents=True, exist_ok=True)
    port = free_port()
    log = workdir / "azurite.log"
    store = (
        ["--location", str(workdir / "azurite")]
        if on_disk  # Azurite refuses --location with --inMemoryPersistence
        else ["--inMemoryPersistence", "--extentMemoryLimit", str(memory_limit_mb)]
    )
    cmd = [
        azurite_binary(),
        "--blobHost",
        "127.0.0.1",
        "--blobPort",
        str(port),
        *store,
        "--skipApiVersionCheck",  # the Python SDK may speak a newer API version
        "--disableTelemetry",
        "--silent",
    ]
    with open(log, "wb") as out:
        proc = subprocess.Popen(cmd, cwd=workdir, stdout=out, stderr=subprocess.STDOUT)
    server = Azurite(port, proc.pid)
    try:
        deadline = time.monotonic() + 60
        while not answers(f"{server.account_url}?comp=list"):
            if proc.poll() is not None or time.monotonic() > deadline:
                pytest.fail(
                    f"Azurite did not start on 127.0.0.1:{port} "
                    f"(exit {proc.poll()}): {log.read_text(errors='replace')[-2000:]}",
                    pytrace=False,
                )
            time.sleep(0.1)  # poll until it answers
        yield server
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)


@pytest.fixture(scope="session")
def azurite(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Azurite]:
    """One Azurite for the test session."""
    with start_azurite(tmp_path_factory.mktemp("azurite")) as server:
        yield server
