"""Retries with bounded exponential backoff and jitter; the bandwidth cap. No real sleeps."""

from __future__ import annotations

import threading

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sidecar.storage.base import (
    AlreadyExists,
    ChecksumMismatch,
    NotFound,
    PermanentError,
    TransientError,
)
from sidecar.upload.bandwidth import LIFT_AT_MOST_SECONDS, BandwidthLimiter
from sidecar.upload.retry import Backoff, retry


class Flaky:
    """Fails with ``errors`` in order, then returns ``"ok"``."""

    def __init__(self, *errors: Exception) -> None:
        self.errors = list(errors)
        self.calls = 0

    def __call__(self) -> str:
        self.calls += 1
        if self.errors:
            raise self.errors.pop(0)
        return "ok"


class Waits:
    def __init__(self, stop_after: int | None = None) -> None:
        self.delays: list[float] = []
        self.stop_after = stop_after

    def __call__(self, seconds: float) -> bool:
        self.delays.append(seconds)
        return self.stop_after is not None and len(self.delays) >= self.stop_after


def test_transient_errors_are_retried_until_success() -> None:
    fn = Flaky(TransientError("503"), ChecksumMismatch("bad part"), TransientError("reset"))
    seen: list[tuple[int, str]] = []
    waits = Waits()
    out = retry(
        fn,
        Backoff(attempts=5, initial=0.5, max_delay=30),
        on_retry=lambda n, e, d: seen.append((n, str(e))),
        wait=waits,
    )
    assert out == "ok"
    assert fn.calls == 4
    assert seen == [(1, "503"), (2, "bad part"), (3, "reset")]
    assert len(waits.delays) == 3
    for i, d in enumerate(waits.delays):
        assert 0 <= d <= 0.5 * 2**i


def test_attempts_are_bounded_and_the_last_error_is_raised() -> None:
    fn = Flaky(*(TransientError(f"try {i}") for i in range(10)))
    waits = Waits()
    with pytest.raises(TransientError, match="try 3"):
        retry(fn, Backoff(attempts=4, initial=0.01, max_delay=0.02), wait=waits)
    assert fn.calls == 4
    assert len(waits.delays) == 3
    assert all(0 <= d <= 0.02 for d in waits.delays)


@pytest.mark.parametrize(
    "err", [PermanentError("access denied"), NotFound("k"), AlreadyExists("k"), OSError("io")]
)
def test_non_retryable_errors_are_raised_at_once(err: Exception) -> None:
    fn = Flaky(err)
    waits = Waits()
    with pytest.raises(type(err)):
        retry(fn, Backoff(attempts=8), wait=waits)
    assert fn.calls == 1
    assert waits.delays == []


def test_stop_during_backoff_raises_the_last_error_without_more_tries() -> None:
    fn = Flaky(TransientError("first"), TransientError("second"), TransientError("third"))
    with pytest.raises(TransientError, match="second"):
        retry(fn, Backoff(attempts=8), wait=Waits(stop_after=2))
    assert fn.calls == 2


def test_stop_event_wait_interrupts_a_long_backoff() -> None:
    stop = threading.Event()
    stop.set()
    fn = Flaky(TransientError("x"), TransientError("y"))
    with pytest.raises(TransientError, match="x"):
        retry(fn, Backoff(attempts=8, initial=1000, max_delay=1000), wait=stop.wait)
    assert fn.calls == 1


@given(
    st.integers(0, 60),
    st.floats(0.001, 10),
    st.floats(0.001, 120),
    st.floats(0, 1, exclude_max=True),
)
@settings(max_examples=200, deadline=None, database=None)
def test_backoff_delay_is_jittered_below_the_exponential_cap(
    attempt: int, initial: float, max_delay: float, r: float
) -> None:
    b = Backoff(attempts=8, initial=initial, max_delay=max_delay)
    cap = min(max_delay, initial * 2.0**attempt)
    d = b.delay(attempt, rng=lambda: r)
    assert 0 <= d <= cap
    assert b.delay(attempt, rng=lambda: 0.0) == 0.0


def test_backoff_grows_exponentially_then_caps() -> None:
    b = Backoff(initial=0.5, max_delay=4.0)
    assert [b.delay(n, rng=lambda: 1.0) for n in range(6)] == [0.5, 1, 2, 4, 4, 4]


# -- bandwidth ---------------------------------------------------------------------------
class FakeTime:
    def __init__(self) -> None:
        self.now = 100.0
        self.slept = 0.0

    def clock(self) -> float:
        return self.now

    def sleep(self, s: float) -> None:
        assert s > 0
        self.now += s
        self.slept += s


def test_unlimited_rate_never_sleeps() -> None:
    ft = FakeTime()
    lim = BandwidthLimiter(0, clock=ft.clock, sleep=ft.sleep)
    assert not lim.limited
    for _ in range(100):
        lim.consume(10**9)
    assert ft.slept == 0


def test_rate_caps_bytes_per_second() -> None:
    ft = FakeTime()
    rate = 1000
    lim = BandwidthLimiter(rate, clock=ft.clock, sleep=ft.sleep)
    start = ft.now
    total = 0
    for _ in range(100):
        lim.consume(200)
        total += 200
        elapsed = ft.now - start
        assert total <= rate * (elapsed + 1.0) + 1e-6, "more than rate plus one second of burst"
    assert ft.now - start == pytest.approx(total / rate, abs=0.15)


def test_after_idle_at_most_one_second_of_burst() -> None:
    ft = FakeTime()
    lim = BandwidthLimiter(1000, clock=ft.clock, sleep=ft.sleep)
    ft.now += 3600
    lim.consume(1000)
    assert ft.slept == 0, "one second's worth may go at once after a pause"
    lim.consume(1000)
    assert ft.slept == pytest.approx(1.0, abs=0.01)


def test_two_workers_share_one_cap() -> None:
    ft = FakeTime()
    lim = BandwidthLimiter(500, clock=ft.clock, sleep=ft.sleep)
    start = ft.now
    for _ in range(50):  # two workers interleaved, 100 bytes each turn
        lim.consume(100)
        lim.consume(100)
    assert ft.now - start == pytest.approx(10_000 / 500, abs=0.15)


def test_lift_removes_the_cap_even_mid_wait() -> None:
    ft = FakeTime()
    limiters: list[BandwidthLimiter] = []

    def sleep_then_lift(s: float) -> None:  # a drain arrives while a worker waits
        ft.sleep(s)
        limiters[0].lift()

    lim = BandwidthLimiter(10, clock=ft.clock, sleep=sleep_then_lift)
    limiters.append(lim)
    lim.consume(10_000)  # would be ~1000 s at 10 B/s
    assert ft.slept <= 0.1 + 1e-9
    assert not lim.limited
    before = ft.now
    lim.consume(10**9)
    assert ft.now == before


def test_the_cap_holds_again_after_a_drain_or_a_flush() -> None:
    """A drain lifts the cap until its deadline, a flush or an early warning until the work
    queued then is done; after that the trainer's bandwidth is protected again."""
    ft = FakeTime()
    lim = BandwidthLimiter(1000, clock=ft.clock, sleep=ft.sleep)
    lim.lift(until=ft.now + 30)  # a drain with 30 s to its deadline
    lim.consume(10**9)
    assert ft.slept == 0
    ft.now += 31
    assert lim.limited
    lim.consume(1000)
    lim.consume(1000)
    assert ft.slept == pytest.approx(1.0, abs=0.01)
    lim.lift()  # POST /v1/flush
    before = ft.slept
    lim.consume(10**9)
    assert ft.slept == before
    lim.work_done()
    assert lim.limited
    lim.lift()  # a flush with nothing queued: no work_done() may ever follow
    assert not lim.limited
    ft.now += LIFT_AT_MOST_SECONDS
    assert lim.limited, "a lift without an end is bounded"


def test_uncapped_for_tells_how_long_the_rate_measured_is_the_links() -> None:
    ft = FakeTime()
    assert BandwidthLimiter(0, clock=ft.clock, sleep=ft.sleep).uncapped_for() == float("inf")
    lim = BandwidthLimiter(1000, clock=ft.clock, sleep=ft.sleep)
    assert lim.uncapped_for() == 0.0
    lim.lift(until=ft.now + 30)
    ft.now += 4
    lim.lift(until=ft.now + 30)  # a second notice: the same uncapped spell
    ft.now += 2
    assert lim.uncapped_for() == pytest.approx(6.0)
    ft.now += 60
    assert lim.uncapped_for() == 0.0
