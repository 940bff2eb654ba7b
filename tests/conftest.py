"""Suite-wide fixtures. Real servers are started by the modules listed in pytest_plugins."""

from __future__ import annotations

pytest_plugins: list[str] = [
    "tests.servers.metadata_aws",
    "tests.servers.metadata_gcp",
    "tests.servers.metadata_azure",
    "tests.servers.azurite",
    "tests.servers.gcs",
]
