"""CRC32C as the stores compute it, and combining the CRCs of adjacent pieces."""

from __future__ import annotations

import base64
from pathlib import Path

from hypothesis import given
from hypothesis import strategies as st

from sidecar.storage.checksum import Crc32c, crc32c_of_bytes, crc32c_of_file


def test_the_standard_check_value() -> None:
    # CRC-32C (Castagnoli) of "123456789" is 0xE3069283 (RFC 3720, B.4 and every CRC catalogue).
    assert crc32c_of_bytes(b"123456789") == base64.b64encode(bytes.fromhex("e3069283")).decode()


def test_a_file_and_its_bytes_agree(tmp_path: Path) -> None:
    data = bytes(range(256)) * 5000  # several read chunks
    (tmp_path / "f").write_bytes(data)
    assert crc32c_of_file(tmp_path / "f") == crc32c_of_bytes(data)


@given(st.lists(st.binary(max_size=300), max_size=6))
def test_extending_by_piece_crcs_equals_reading_the_whole(pieces: list[bytes]) -> None:
    whole, combined = Crc32c(), Crc32c()
    for p in pieces:
        whole.update(p)
        part = Crc32c()
        part.update(memoryview(p))
        combined.extend(part.value(), len(p))
    assert combined.b64() == whole.b64() == crc32c_of_bytes(b"".join(pieces))
