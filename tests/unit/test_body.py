"""BytesBody is a file over bytes in memory: what urllib3 and botocore ask of a request body
(a length, reads in blocks, a rewind for a retry), without copying the bytes."""

from __future__ import annotations

import os

from sidecar.storage.body import BLOCK, BytesBody


def test_reads_in_blocks_give_back_every_byte_in_order_and_a_rewind_starts_again() -> None:
    data = os.urandom(3 * BLOCK + 5)
    body = BytesBody(data)
    assert len(body) == len(data)
    blocks = []
    while block := body.read(BLOCK):
        blocks.append(bytes(block))
    assert [len(b) for b in blocks] == [BLOCK, BLOCK, BLOCK, 5]
    assert b"".join(blocks) == data
    assert body.tell() == len(data)
    assert body.seek(0) == 0
    assert bytes(body.read()) == data


def test_reads_are_views_of_the_same_buffer_not_copies() -> None:
    data = bytes(range(256)) * 1024
    block = BytesBody(data).read(BLOCK)
    assert isinstance(block, memoryview)
    assert block.obj is data


def test_seek_from_the_current_position_and_the_end_stays_inside_the_body() -> None:
    body = BytesBody(b"0123456789")
    body.read(4)
    assert body.seek(2, os.SEEK_CUR) == 6
    assert bytes(body.read(2)) == b"67"
    assert body.seek(-3, os.SEEK_END) == 7
    assert body.seek(100) == 10
    assert bytes(body.read(1)) == b""
