"""Suite-wide fixtures. Real servers are started by the modules listed in pytest_plugins."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.e2e.harness import Daemon

pytest_plugins: list[str] = [
    "tests.servers.metadata_aws",
    "tests.servers.metadata_gcp",
    "tests.servers.metadata_azure",
    "tests.servers.azurite",
    "tests.servers.gcs",
    "tests.servers.seaweedfs",
]


@pytest.fixture
def dirs(tmp_path: Path) -> tuple[Path, Path]:
    watch = tmp_path / "checkpoints"
    remote = tmp_path / "remote"
    watch.mkdir()
    return watch, remote


@pytest.fixture
def daemons() -> Iterator[list[Daemon]]:
    """Collects daemons started by a test; each is killed at the end if still running."""
    started: list[Daemon] = []
    yield started
    for d in started:
        d.close()
