"""Azure downloads against Azurite, through the client the daemon and restore build."""

from __future__ import annotations

import os
import tracemalloc
from pathlib import Path

from sidecar.storage.azure import AzureBackend, create
from sidecar.storage.checksum import crc32c_of_bytes
from sidecar.storage.url import parse_destination
from tests.servers.azurite import Azurite

MiB = 1024 * 1024


def test_a_download_holds_a_few_mib_not_the_first_32(azurite: Azurite, tmp_path: Path) -> None:
    """The SDK's first GET of a download is 32 MiB unless told otherwise, held several times
    over (302 MB traced for this blob); a restore runs four downloads at once."""
    container = azurite.new_container()
    dest = azurite.destination(f"az://{container}/ckpt")
    backend = create(parse_destination(dest.url), dest)
    assert isinstance(backend, AzureBackend)
    data = os.urandom(48 * MiB)
    src = tmp_path / "model.pt"
    src.write_bytes(data)
    backend.put_file("model.pt", src)
    tracemalloc.start()
    try:
        info = backend.get_file("model.pt", tmp_path / "restored.pt")
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
        backend.close()
        azurite.delete_container(container)
    assert peak < 64 * MiB
    assert info.crc32c == crc32c_of_bytes(data)
    assert (tmp_path / "restored.pt").read_bytes() == data
