"""A store that never answers at start-up (a firewall dropping packets): the admin listener
answers meanwhile, a SIGTERM drains and the process exits before the deadline, and a
checkpoint already in the watch folder is reported not durable (exit 4), never durable. A
store that is only slow to answer gets the checkpoint within the deadline (exit 0)."""

from __future__ import annotations

import json
import os
import signal
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path
from urllib.parse import urlsplit

import pytest

from tests.e2e.harness import Daemon, admin_get, write_atomic
from tests.faults.s3remote import Remote
from tests.servers.blackhole import blackhole
from tests.servers.faultproxy import FaultProxy
from tests.servers.seaweedfs import S3Server, new_bucket

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


def test_a_store_slow_to_answer_at_start_gets_the_checkpoint_before_the_deadline(
    dirs: tuple[Path, Path], daemons: list[Daemon], s3_server: S3Server
) -> None:
    """SIGTERM while start-up waits for a slow first answer: the drain waits for start-up
    (it gave up after a second, exit 4, with the store about to answer)."""
    watch, _ = dirs
    data = os.urandom(100_000)
    write_atomic(watch / "step_1.pt", data)
    remote = Remote(s3_server, new_bucket(s3_server, "slowstart"))
    u = urlsplit(s3_server.endpoint_url)
    assert u.hostname and u.port
    proxy = FaultProxy(u.hostname, u.port)
    try:
        proxy.set(delay=4.0)  # each new connection waits before it reaches the store
        d = Daemon(
            watch,
            remote.url,
            env={**remote.env(proxy.url), "CKPT_SIDECAR_SHUTDOWN_GRACE_SECONDS": str(GRACE)},
        )
        daemons.append(d)
        d.wait_for("preemption.started", timeout=30)  # start-up now talks to the store
        d.proc.send_signal(signal.SIGTERM)
        d.wait_for("drain.started", timeout=10)
        proxy.heal()
        assert d.proc.wait(timeout=GRACE + 30) == 0
        done = d.wait_for("drain.done", timeout=5)
        assert done["outcome"] == "committed" and done["last_committed"]["name"] == "step_1.pt"
        assert [m.name for m in remote.manifests()] == ["step_1.pt"]
    finally:
        proxy.close()
        remote.close()
