"""Bytes damaged between us and the store never stay stored: a proxy flips one byte.

gcp-storage-emulator checks the CRC32C sent in the object metadata and refuses the
upload; fake-gcs-server checks nothing, so the backend's own comparison with what the
store reports catches the damage and deletes the object. Either way the caller gets a
retryable :class:`ChecksumMismatch` and no damaged object is left.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from sidecar.storage.base import ChecksumMismatch, NotFound, TransientError
from sidecar.storage.checksum import crc32c_of_bytes
from tests.servers.gcs import GcsServer, gcs_backend, gcs_proxy

CHUNK = 256 * 1024


def test_store_refuses_a_small_object_whose_crc32c_differs(gcs_emulator: GcsServer) -> None:
    with gcs_proxy(gcs_emulator) as proxy:
        backend = gcs_backend(proxy.url, gcs_emulator.new_bucket())
        proxy.corrupt("POST", "uploadType=multipart")
        with pytest.raises(ChecksumMismatch, match="rejected the CRC32C") as err:
            backend.put_bytes("m.json", b'{"step": 7}')
        assert isinstance(err.value, TransientError)  # the uploader sends it again
        assert proxy.statuses("POST", "uploadType=multipart") == [400]
        with pytest.raises(NotFound):
            backend.head("m.json")
        backend.put_bytes("m.json", b'{"step": 7}')  # undamaged: accepted
        assert backend.get_bytes("m.json") == b'{"step": 7}'
        backend.close()


@pytest.mark.parametrize("emulator", ["gcs_emulator", "fake_gcs_server"])
def test_damaged_resumable_chunk_leaves_no_object(
    emulator: str, request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    server: GcsServer = request.getfixturevalue(emulator)
    data = os.urandom(3 * CHUNK + 17)
    src = tmp_path / "w.pt"
    src.write_bytes(data)
    with gcs_proxy(server) as proxy:
        backend = gcs_backend(proxy.url, server.new_bucket(), chunk_size_bytes=CHUNK)
        proxy.corrupt("PUT", "upload_id=")  # the first chunk
        with pytest.raises(ChecksumMismatch, match="deleted") as err:
            backend.put_file("w.pt", src)
        assert isinstance(err.value, TransientError)
        with pytest.raises(NotFound):
            backend.head("w.pt")
        info = backend.put_file("w.pt", src)  # undamaged: stored
        assert info.crc32c == crc32c_of_bytes(data)
        assert backend.head("w.pt").crc32c == crc32c_of_bytes(data)
        backend.close()


def test_damaged_download_is_refused(fake_gcs_server: GcsServer, tmp_path: Path) -> None:
    backend = gcs_backend(fake_gcs_server.url, fake_gcs_server.new_bucket())
    backend.put_bytes("m.bin", b"0123456789" * 100)
    with gcs_proxy(fake_gcs_server) as proxy:
        reader = gcs_backend(proxy.url, backend.bucket_name, backend.prefix)
        proxy.corrupt_responses("GET", "alt=media")
        with pytest.raises(ChecksumMismatch):
            reader.get_file("m.bin", tmp_path / "m.bin")
        assert not (tmp_path / "m.bin").exists()
        reader.close()
    backend.close()
