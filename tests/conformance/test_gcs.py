"""``gs://`` passes the conformance suite against two emulators, each with its gaps declared.

Between them every test of the suite runs against a real server: what one emulator
cannot do, the other does.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from typing import ClassVar

import pytest

from sidecar.storage.base import Backend
from tests.conformance.suite import BackendConformance
from tests.servers.gcs import GcsServer, gcs_backend

#: 5 MiB chunks: the suite's large file (15 MiB + 12345 bytes) takes four requests.
CHUNK = 5 * 1024 * 1024
_prefixes = itertools.count()


def _backend(server: GcsServer, bucket: str) -> Iterator[Backend]:
    backend = gcs_backend(
        server.url, bucket, f"conformance/{next(_prefixes)}/run 1", chunk_size_bytes=CHUNK
    )
    yield backend
    backend.close()


@pytest.fixture(scope="module")
def emulator_bucket(gcs_emulator: GcsServer) -> str:
    return gcs_emulator.new_bucket("conformance")


@pytest.fixture(scope="module")
def fake_bucket(fake_gcs_server: GcsServer) -> str:
    return fake_gcs_server.new_bucket("conformance")


class TestGcpStorageEmulator(BackendConformance):
    GAPS: ClassVar[dict[str, str]] = {
        "test_create_only_conflict": "gcp-storage-emulator ignores ifGenerationMatch "
        "(passes on fake-gcs-server)",
        "test_create_only_race_has_one_winner": "gcp-storage-emulator ignores "
        "ifGenerationMatch (passes on fake-gcs-server)",
        "test_listing_many": "gcp-storage-emulator ignores maxResults, so its listing is one "
        "page and paging goes untested, at 20 s for the 1,100 puts (passes on fake-gcs-server, "
        "which pages)",
    }

    @pytest.fixture
    def backend(self, gcs_emulator: GcsServer, emulator_bucket: str) -> Iterator[Backend]:
        yield from _backend(gcs_emulator, emulator_bucket)


class TestFakeGcsServer(BackendConformance):
    GAPS: ClassVar[dict[str, str]] = {}

    @pytest.fixture
    def backend(self, fake_gcs_server: GcsServer, fake_bucket: str) -> Iterator[Backend]:
        yield from _backend(fake_gcs_server, fake_bucket)
