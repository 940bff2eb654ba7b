"""send_parts, the budgeted part loop every multipart backend uses: a failure anywhere is
raised, stops the reading, and gives every slot back."""

from __future__ import annotations

import concurrent.futures as cf
import threading

import pytest

from sidecar.storage.budget import Budget
from sidecar.storage.parts import send_parts

SLOTS = 3
PARTS = 20
FAILING = 5


class Boom(Exception):
    pass


def all_slots_free(budget: Budget) -> bool:
    """True when ``SLOTS`` slots can be taken at once (an acquire blocks while none is free)."""
    got = threading.Event()

    def take() -> None:
        for _ in range(SLOTS):
            budget.acquire()
        got.set()

    threading.Thread(target=take, daemon=True).start()
    return got.wait(5.0)


@pytest.mark.parametrize("failing", ["next_part", "send", "on_sent"])
def test_a_failure_is_raised_stops_reading_and_every_slot_comes_back(failing: str) -> None:
    budget = Budget(SLOTS)
    made = 0
    part_done = threading.Event()  # parts after the failing one wait for it: no race ahead
    sent: list[int] = []

    def next_part() -> int | None:
        nonlocal made
        if made == PARTS:
            return None
        made += 1
        if failing == "next_part" and made == FAILING:
            raise Boom("read")
        return made

    def send(n: int) -> int:
        if n > FAILING:
            assert part_done.wait(5.0)
        if n == FAILING:
            part_done.set()
            if failing == "send":
                raise Boom("send")
        return n

    def on_sent(n: int) -> None:
        if failing == "on_sent" and n == FAILING:
            raise Boom("progress")
        sent.append(n)

    with (
        cf.ThreadPoolExecutor(SLOTS) as pool,
        cf.ThreadPoolExecutor(1) as reader,
        pytest.raises(Boom),
    ):
        send_parts(next_part, send, on_sent, budget=budget, pool=pool, reader=reader)
    assert made <= FAILING + SLOTS, f"read {made} parts; reading goes on after the failure"
    assert FAILING not in sent
    assert all_slots_free(budget)
