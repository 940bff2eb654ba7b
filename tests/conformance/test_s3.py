"""``s3://`` passes the conformance suite against a real SeaweedFS server.

Each test gets its own fresh bucket and writes under a prefix, so prefix handling is
exercised everywhere; parts are 5 MiB so the suite's large file takes four parts.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, ClassVar

import pytest

from sidecar.storage.base import Backend
from sidecar.storage.options import S3Options
from sidecar.storage.s3 import S3Backend
from tests.conformance.suite import BackendConformance
from tests.servers.seaweedfs import S3Server, new_bucket

MiB = 1024 * 1024


def s3_backend(
    server: S3Server,
    bucket: str,
    prefix: str = "run/node-0",
    *,
    endpoint_url: str | None = None,
    allowed_regions: list[str] | None = None,
    **options: Any,
) -> S3Backend:
    """A backend on ``bucket``/``prefix`` with 5 MiB parts, set up as a user would; the
    credentials come from the environment (the ``s3_env`` fixture)."""
    settings: dict[str, Any] = {
        "endpoint_url": endpoint_url or server.endpoint_url,
        "region": server.region,
        "addressing_style": "path",
        "multipart_threshold_bytes": 5 * MiB,
        "part_size_bytes": 5 * MiB,
        "part_concurrency": 4,
    }
    settings.update(options)
    return S3Backend(bucket, prefix, S3Options(**settings), allowed_regions=allowed_regions)


class TestS3Backend(BackendConformance):
    GAPS: ClassVar[dict[str, str]] = {}  # none: SeaweedFS supports all the suite asks

    @pytest.fixture
    def backend(self, s3_env: S3Server) -> Iterator[Backend]:
        backend = s3_backend(s3_env, new_bucket(s3_env, "conformance"))
        yield backend
        backend.close()
