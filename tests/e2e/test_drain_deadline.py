"""A notice while an older checkpoint uploads over a slow link and a newer one is complete:
the newer one is committed before the deadline and the older one is abandoned cleanly."""

from __future__ import annotations

import json
import os
import signal
import threading
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from tests.e2e.harness import Daemon, checkpoint_is, write_atomic
from tests.servers.faultproxy import FaultProxy

if TYPE_CHECKING:
    from tests.servers.gcs import GcsServer

MB = 1024 * 1024
UPLINK = 2 * MB  # bytes/s through the proxy, for every upload together


@pytest.fixture
def slow_gcs(gcs_emulator: GcsServer) -> Iterator[FaultProxy]:
    host, port = gcs_emulator.url.removeprefix("http://").split(":")
    proxy = FaultProxy(host, int(port))
    proxy.set(rate=UPLINK)
    yield proxy
    proxy.close()


def _daemon(
    watch: Path, daemons: list[Daemon], proxy: FaultProxy, bucket: str, grace: float
) -> Daemon:
    """The daemon uploading through the slow uplink in 256 KiB chunks; notice deadline = grace."""
    d = Daemon(
        watch,
        f"gs://{bucket}/run",
        env={
            "STORAGE_EMULATOR_HOST": proxy.url,
            "CKPT_SIDECAR_DESTINATION__GCS__CHUNK_SIZE_BYTES": str(256 * 1024),
            "CKPT_SIDECAR_SHUTDOWN_GRACE_SECONDS": str(grace),
        },
    )
    daemons.append(d)
    d.wait_for("daemon.ready", timeout=60)
    return d


def _sent(port: int) -> int:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/v1/status", timeout=5) as r:
        flight = json.load(r)["in_flight"]
    return sum(f["sent"] for f in flight["files"]) if flight else 0


def test_newest_checkpoint_beats_the_deadline_older_is_abandoned(
    dirs: tuple[Path, Path],
    daemons: list[Daemon],
    slow_gcs: FaultProxy,
    gcs_emulator: GcsServer,
) -> None:
    watch, _ = dirs
    grace = 8.0
    d = _daemon(watch, daemons, slow_gcs, gcs_emulator.new_bucket("drain"), grace)
    port = d.admin_port

    older = watch / "step_1"
    tmp = watch / "step_1.partial"
    tmp.mkdir()
    for i in range(2):
        (tmp / f"shard{i}.bin").write_bytes(os.urandom(10 * MB))  # 20 MB: 10 s at the uplink
    os.replace(tmp, older)
    d.wait_for("checkpoint.ready", where=checkpoint_is("step_1"))
    tick = threading.Event()
    while _sent(port) < 1 * MB:  # the older one is on its way
        tick.wait(0.1)
    write_atomic(watch / "step_2.pt", os.urandom(3 * MB))  # 1.5 s at the uplink
    d.wait_for("checkpoint.ready", where=checkpoint_is("step_2.pt"))

    d.proc.send_signal(signal.SIGUSR1)  # deadline = now + grace
    d.wait_for("drain.cancel_older", where=lambda e: e["checkpoint"] == "step_1")
    committed = d.wait_for("checkpoint.committed", timeout=grace, where=checkpoint_is("step_2.pt"))
    done = d.wait_for("drain.done", timeout=grace)
    assert done["outcome"] == "committed", done
    assert done["margin_seconds"] > 0, done
    assert committed["bytes"] == 3 * MB
    d.wait_for("checkpoint.cancelled", where=checkpoint_is("step_1"))
    assert d.terminate() == 0
    assert all(e["checkpoint"] != "step_1" for e in d.named("checkpoint.committed"))


def test_emergency_checkpoint_after_the_notice_goes_first(
    dirs: tuple[Path, Path],
    daemons: list[Daemon],
    slow_gcs: FaultProxy,
    gcs_emulator: GcsServer,
) -> None:
    watch, _ = dirs
    grace = 8.0
    d = _daemon(watch, daemons, slow_gcs, gcs_emulator.new_bucket("emergency"), grace)
    write_atomic(watch / "step_2.pt", os.urandom(12 * MB))  # 6 s at the uplink
    d.wait_for("checkpoint.ready", where=checkpoint_is("step_2.pt"))
    tick = threading.Event()
    while _sent(d.admin_port) < 1 * MB:
        tick.wait(0.1)
    d.proc.send_signal(signal.SIGUSR1)
    d.wait_for("drain.started")
    # The trainer sees the notice file and writes an emergency checkpoint at once.
    assert (watch / ".ckpt-sidecar-notice.json").is_file()
    write_atomic(watch / "step_3.pt", os.urandom(1 * MB))
    d.wait_for("drain.emergency_checkpoint", where=checkpoint_is("step_3.pt"))
    first = d.wait_for("checkpoint.committed", timeout=grace)
    assert first["checkpoint"] == "step_3.pt", "the emergency checkpoint is committed first"
    done = d.wait_for("drain.done", timeout=grace)
    assert done["outcome"] == "committed" and done["last_committed"]["name"] == "step_3.pt"
    assert done["margin_seconds"] > 0
    assert d.terminate() == 0


def test_older_nearly_done_goes_first_when_the_newest_cannot_make_it(
    dirs: tuple[Path, Path],
    daemons: list[Daemon],
    slow_gcs: FaultProxy,
    gcs_emulator: GcsServer,
) -> None:
    watch, _ = dirs
    grace = 5.0
    d = _daemon(watch, daemons, slow_gcs, gcs_emulator.new_bucket("older"), grace)
    write_atomic(watch / "step_1.pt", os.urandom(6 * MB))  # 3 s at the uplink
    d.wait_for("checkpoint.ready", where=checkpoint_is("step_1.pt"))
    tick = threading.Event()
    while _sent(d.admin_port) < 4 * MB:  # nearly done: about 1 s left
        tick.wait(0.05)
    write_atomic(watch / "step_2.pt", os.urandom(30 * MB))  # 15 s: cannot make a 5 s deadline
    d.wait_for("checkpoint.ready", where=checkpoint_is("step_2.pt"))
    d.proc.send_signal(signal.SIGUSR1)
    older = d.wait_for("drain.older_first", where=checkpoint_is("step_1.pt"))
    assert older["chosen"] == "step_2.pt"
    d.wait_for("checkpoint.committed", timeout=grace, where=checkpoint_is("step_1.pt"))
    done = d.wait_for("drain.done", timeout=grace + 5)
    assert done["outcome"] == "missed" and done["not_durable"] == ["step_2.pt"]
    assert done["last_committed"]["name"] == "step_1.pt"
    d.kill()  # the machine is gone at the deadline
