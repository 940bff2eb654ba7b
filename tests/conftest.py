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


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Files that hold a test marked ``slow`` or ``wheel`` (20 s or more) run first, in their
    own order: ``make test`` spreads files over two workers (``-n 2 --dist loadfile``), and a
    long file left to the end would run alone while the other worker waits."""
    long_files = {
        i.path for i in items if i.get_closest_marker("slow") or i.get_closest_marker("wheel")
    }
    items.sort(key=lambda i: i.path not in long_files)
