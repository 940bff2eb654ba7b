"""The Azure Blob backend passes the whole conformance suite against Azurite, no gaps."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from sidecar.storage.azure import create
from sidecar.storage.base import Backend
from sidecar.storage.url import parse_destination
from tests.conformance.suite import BackendConformance
from tests.servers.azurite import ACCOUNT, Azurite

MiB = 1024 * 1024


class TestAzureBackend(BackendConformance):
    @pytest.fixture
    def backend(self, azurite: Azurite) -> Iterator[Backend]:
        container = azurite.new_container()
        dest = azurite.destination(
            f"az://{container}/run-1",
            account=ACCOUNT,
            block_size_bytes=4 * MiB,  # LARGE_SIZE becomes four blocks
            max_concurrency=4,
        )
        backend = create(parse_destination(dest.url), dest)
        backend.check()
        yield backend
        backend.close()
        azurite.delete_container(container)
