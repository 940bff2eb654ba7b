"""Notice detection latency per source, against the fake metadata servers.

For each trial: a fresh fake server and a :class:`~sidecar.preemption.poller.Poller` with the
source's production defaults; once the source has answered one poll, wait a random part of
its interval, flip the fake to "notice", and time the flip to ``on_notice``.

Run from the repository root:

    .venv/bin/python -m bench.preemption_latency [--trials 15]

Prints a Markdown table (milliseconds) and writes ``bench/preemption.json`` (every trial);
``bench/preemption.md`` holds the measured runs.
"""

from __future__ import annotations

import argparse
import logging
import random
import statistics
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path

import structlog

from bench._common import Report
from sidecar.model import Notice
from sidecar.preemption.aws import AwsSpotSource
from sidecar.preemption.azure import AzureScheduledEventsSource
from sidecar.preemption.base import Source
from sidecar.preemption.gcp import maintenance_watch, preempted_watch
from sidecar.preemption.options import (
    AwsMetadataOptions,
    AzureMetadataOptions,
    GcpMetadataOptions,
)
from sidecar.preemption.poller import Poller
from sidecar.preemption.trigger import TriggerFileSource
from tests.servers.metadata_aws import FakeAwsMetadata
from tests.servers.metadata_azure import FakeAzureMetadata
from tests.servers.metadata_gcp import FakeGcpMetadata

Setup = Callable[[], tuple[list[Source], Callable[[], float], Callable[[], None]]]
"""Builds (sources, flip() -> flip time (monotonic), teardown)."""


def _aws() -> tuple[list[Source], Callable[[], float], Callable[[], None]]:
    fake = FakeAwsMetadata().start()

    def flip() -> float:
        fake.interrupt()
        assert fake.flipped_at is not None
        return fake.flipped_at

    return [AwsSpotSource(AwsMetadataOptions(), fake.url)], flip, fake.stop


def _gcp(key: str) -> Setup:
    def setup() -> tuple[list[Source], Callable[[], float], Callable[[], None]]:
        fake = FakeGcpMetadata().start()
        opts, endpoint = GcpMetadataOptions(), f"http://{fake.host}"
        watch = preempted_watch if key == "preempted" else maintenance_watch
        value = "TRUE" if key == "preempted" else "TERMINATE_ON_HOST_MAINTENANCE"

        def flip() -> float:
            fake.set(f"instance/{key}", value)
            assert fake.flipped_at is not None
            return fake.flipped_at

        return [watch(opts, endpoint)], flip, fake.stop

    return setup


def _azure() -> tuple[list[Source], Callable[[], float], Callable[[], None]]:
    fake = FakeAzureMetadata().start()

    def flip() -> float:
        fake.schedule("Preempt")
        assert fake.flipped_at is not None
        return fake.flipped_at

    return [AzureScheduledEventsSource(AzureMetadataOptions(base_url=fake.url))], flip, fake.stop


def _file() -> tuple[list[Source], Callable[[], float], Callable[[], None]]:
    tmp = tempfile.TemporaryDirectory()
    path = Path(tmp.name) / "drain-now"

    def flip() -> float:
        path.touch()
        return time.monotonic()

    return [TriggerFileSource(path, default_deadline_seconds=30)], flip, tmp.cleanup


def trial(setup: Setup) -> float:
    """Seconds from the flip to ``on_notice``."""
    sources, flip, teardown = setup()
    got = threading.Event()
    received: list[float] = []

    def on_notice(n: Notice) -> None:
        received.append(time.monotonic())
        got.set()

    poller = Poller(sources, on_notice)
    poller.start()
    try:
        deadline = time.monotonic() + 10
        while poller.health()[0].polls < 1 and sources[0].interval > 0:
            assert time.monotonic() < deadline, "source never answered"
            time.sleep(0.005)
        time.sleep(random.uniform(0, max(sources[0].interval, 0.2)))
        flipped = flip()
        assert got.wait(10), "no notice"
        return received[0] - flipped
    finally:
        poller.stop()
        teardown()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=15)
    args = parser.parse_args()
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.ERROR))
    cases: list[tuple[str, str, Setup]] = [
        ("aws (spot/instance-action)", "poll every 1 s", _aws),
        ("gcp (instance/preempted)", "wait_for_change", _gcp("preempted")),
        ("gcp (maintenance-event)", "wait_for_change", _gcp("maintenance-event")),
        ("azure (Scheduled Events)", "poll every 1 s", _azure),
        ("file (trigger file)", "stat every 0.5 s", _file),
    ]
    report = Report("preemption")
    table = [
        f"{args.trials} trials per source",
        "",
        "| source | how | min ms | median ms | p90 ms | max ms |",
        "|---|---|---:|---:|---:|---:|",
    ]
    for name, how, setup in cases:
        ms = sorted(trial(setup) * 1000 for _ in range(args.trials))
        p90 = ms[min(len(ms) - 1, round(0.9 * (len(ms) - 1)))]
        report.rows.append({"source": name, "how": how, "trials_ms": [round(x, 1) for x in ms]})
        table.append(
            f"| {name} | {how} | {ms[0]:.0f} | {statistics.median(ms):.0f} | {p90:.0f} "
            f"| {ms[-1]:.0f} |"
        )
    report.finish("\n".join(table), merge_on=("source",))


if __name__ == "__main__":
    main()
