"""A store behind a firewall that drops packets fails within our connect timeout, not the
SDK's default (botocore 60 s per attempt, azure-core 300 s, capped by the kernel's ~127 s):
an operator sees the error in seconds and a stop is not held for minutes.

The timeouts are set to 1 s here so that the test is quick; the bound on the elapsed time is
far below what each SDK's default would take, so the test fails if our setting is ignored.
"""

from __future__ import annotations

import time

import pytest
from azure.storage.blob import BlobServiceClient

from sidecar.storage import azure_client, s3_client
from sidecar.storage.azure import AzureBackend
from sidecar.storage.base import Backend, StorageError
from sidecar.storage.options import AzureOptions, S3Options
from sidecar.storage.s3 import S3Backend
from tests.servers.azurite import ACCOUNT, KEY
from tests.servers.blackhole import blackhole


def _seconds_to_fail(backend: Backend, message: str) -> float:
    """How long ``check()`` takes to raise a StorageError matching ``message``."""
    start = time.monotonic()
    with pytest.raises(StorageError, match=message):
        backend.check()
    elapsed = time.monotonic() - start
    backend.close()
    return elapsed


def test_s3_gives_up_connecting_after_its_connect_timeout(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(s3_client, "CONNECT_TIMEOUT_SECONDS", 1.0)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "test-key-id")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "test-secret")
    monkeypatch.setenv("AWS_MAX_ATTEMPTS", "2")
    with blackhole() as url:
        backend = S3Backend(
            "ckpt", "run", S3Options(endpoint_url=url, region="us-east-1", addressing_style="path")
        )
        elapsed = _seconds_to_fail(backend, "cannot reach the endpoint")
    assert elapsed < 30, f"2 attempts took {elapsed:.0f} s: botocore's 60 s connect timeout"


def test_azure_gives_up_connecting_after_its_connect_timeout(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(azure_client, "CONNECT_TIMEOUT_SECONDS", 1.0)
    with blackhole() as url:
        # The transport build_container_client uses, with one attempt instead of four.
        service = BlobServiceClient(
            f"{url}/{ACCOUNT}",
            credential={"account_name": ACCOUNT, "account_key": KEY},
            transport=azure_client._transport(16),
            retry_total=0,
        )
        backend = AzureBackend(
            service.get_container_client("ckpt"), "run", AzureOptions(), account=ACCOUNT
        )
        elapsed = _seconds_to_fail(backend, "could not be reached")
    assert elapsed < 30, f"one attempt took {elapsed:.0f} s: azure-core's 300 s connect timeout"
