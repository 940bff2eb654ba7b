"""A store that never answers at start-up (a firewall dropping packets): the admin listener
answers meanwhile, a SIGTERM drains and the process exits before the deadline, and a
checkpoint already in the watch folder is reported not durable (exit 4), never durable."""

from __future__ import annotations

import json
import os
import signal
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path

import pytest

from tests.e2e.harness import Daemon, admin_get, write_atomic
from tests.servers.blackhole import blackhole

GRACE = 10.0  # seconds from SIGTERM to the drain deadline


@pytest.fixture
def dropped() -> Iterator[str]:
    with blackhole() as url:
        yield url


def _stalled_daemon(watch: Path, daemons: list[Daemon], endpoint: str) -> Daemon:
    d = Daemon(
        watch,
        "s3://ckpt/run",
        env={
            "CKPT_SIDECAR_DESTINATION__S3__ENDPOINT_URL": endpoint,
            "CKPT_SIDECAR_SHUTDOWN_GRACE_SECONDS": str(GRACE),
            "AWS_ACCESS_KEY_ID": "test-key-id",
            "AWS_SECRET_ACCESS_KEY": "test-secret",
            "AWS_REGION": "us-east-1",
        },
    )
    daemons.append(d)
    d.wait_for("preemption.started", timeout=30)  # start-up now talks to the store
    return d


def _stop_and_check_deadline(d: Daemon) -> int:
    d.proc.send_signal(signal.SIGTERM)
    started = d.wait_for("drain.started", timeout=10)
    rc = d.proc.wait(timeout=GRACE + 30)
    stopped = d.wait_for("daemon.stopped", timeout=5)
    deadline = datetime.fromisoformat(started["deadline"])
    assert datetime.fromisoformat(stopped["timestamp"]) < deadline, (
        f"stopped at {stopped['timestamp']}, after the drain deadline {started['deadline']}"
    )
    return rc


def test_checkpoint_present_exits_4_before_the_deadline(
    dirs: tuple[Path, Path], daemons: list[Daemon], dropped: str
) -> None:
    watch, _ = dirs
    write_atomic(watch / "step_1.pt", os.urandom(1024))
    d = _stalled_daemon(watch, daemons, dropped)
    status, body = admin_get(d.admin_port, "/readyz")
    assert status == 503 and "destination not reachable yet" in json.loads(body)["problems"]
    rc = _stop_and_check_deadline(d)
    assert rc == 4
    unverified = d.wait_for("drain.unverified", timeout=5)
    assert unverified["checkpoints"] == ["step_1.pt"]
    assert d.wait_for("drain.done", timeout=5)["not_durable"] == ["step_1.pt"]


def test_empty_folder_exits_0_before_the_deadline(
    dirs: tuple[Path, Path], daemons: list[Daemon], dropped: str
) -> None:
    watch, _ = dirs
    d = _stalled_daemon(watch, daemons, dropped)
    assert _stop_and_check_deadline(d) == 0
    assert d.named("drain.unverified") == []
    assert d.wait_for("drain.done", timeout=5)["outcome"] == "committed"
