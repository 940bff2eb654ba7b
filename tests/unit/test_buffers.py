"""Part buffers: reused between parts, never more kept than asked, dropped when the budget
goes idle; read_into fills a buffer and checksums exactly the bytes it read."""

from __future__ import annotations

import io
import os

from sidecar.storage.budget import Budget
from sidecar.storage.buffers import PIECE, PartBuffers, read_into
from sidecar.storage.checksum import Crc32c, crc32c_of_bytes


def test_a_given_back_buffer_is_taken_again_if_large_enough() -> None:
    pool = PartBuffers(keep=2)
    buf = pool.take(1000)
    assert len(buf) == 1000
    pool.give(buf)
    assert pool.take(500) is buf
    pool.give(buf)
    assert len(pool.take(2000)) == 2000  # too small: a new one, and the small one is dropped
    assert pool.free_count() == 0


def test_no_more_than_keep_buffers_are_kept() -> None:
    pool = PartBuffers(keep=2)
    for buf in [pool.take(10) for _ in range(5)]:
        pool.give(buf)
    assert pool.free_count() == 2


def test_the_budget_going_idle_drops_the_free_buffers() -> None:
    pool = PartBuffers(keep=3)
    budget = Budget(3, on_idle=pool.clear)
    budget.acquire()
    budget.acquire()
    pool.give(pool.take(10))
    budget.release()
    assert pool.free_count() == 1  # one slot still taken: kept for the next part
    budget.release()
    assert pool.free_count() == 0


def test_memory_of_another_kind_makes_room_so_buffers_stay_within_the_slots() -> None:
    pool = PartBuffers(keep=3)
    budget = Budget(3, on_idle=pool.clear)
    for _ in range(3):
        budget.acquire()
    parts = [pool.take(10) for _ in range(3)]  # three parts at once
    for buf in parts[1:]:  # two are done; the third is still going up
        pool.give(buf)
        budget.release()
    assert pool.free_count() == 2
    for _ in range(2):  # two small files, each read into bytes of its own under a slot
        budget.acquire()
        pool.make_room()
    assert pool.free_count() == 0  # 3 slots: 1 part buffer and 2 files, nothing more
    pool.make_room()  # nothing free: nothing to drop
    assert pool.free_count() == 0


def test_read_into_fills_the_view_and_checksums_what_it_read() -> None:
    data = os.urandom(3 * PIECE + 5)
    buf = bytearray(b"x" * (4 * PIECE))
    crc = Crc32c()
    f = io.BufferedReader(io.BytesIO(data))
    n = read_into(f, memoryview(buf)[: 2 * PIECE + 1], crc)
    assert n == 2 * PIECE + 1
    assert crc.b64() == crc32c_of_bytes(data[:n])
    rest = Crc32c()
    m = read_into(f, memoryview(buf), rest)  # the file ends before the view does
    assert m == len(data) - n
    assert bytes(buf[:m]) == data[n:]
    assert rest.b64() == crc32c_of_bytes(data[n:])
    assert read_into(f, memoryview(buf), Crc32c()) == 0
