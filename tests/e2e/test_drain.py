"""Every way a drain starts, end to end with the daemon as a subprocess."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING

from tests.e2e.harness import Daemon, admin_get, assert_invariant, checkpoint_is, write_atomic

if TYPE_CHECKING:
    from tests.servers.metadata_aws import FakeAwsMetadata


def _notice_file(watch: Path) -> dict[str, str]:
    data = json.loads((watch / ".ckpt-sidecar-notice.json").read_text())
    assert isinstance(data, dict)
    return data


def test_sigterm_drains_then_exits_0(dirs: tuple[Path, Path], daemons: list[Daemon]) -> None:
    watch, remote = dirs
    d = Daemon(watch, f"file://{remote}")
    daemons.append(d)
    d.wait_for("daemon.ready")
    write_atomic(watch / "step_4.pt", os.urandom(500_000))
    d.wait_for("checkpoint.ready")
    assert d.terminate() == 0
    done = d.wait_for("drain.done")
    assert done["outcome"] == "committed" and done["last_committed"]["name"] == "step_4.pt"
    assert _notice_file(watch)["source"] == "signal"
    assert {m.name for m in assert_invariant(remote)} == {"step_4.pt"}


def test_sigterm_waits_for_a_checkpoint_still_being_written(
    dirs: tuple[Path, Path], daemons: list[Daemon]
) -> None:
    """Slurm's scancel, or a pod without native sidecars, sends SIGTERM to the trainer and
    the sidecar at once: the checkpoint the trainer is writing then is uploaded before the
    sidecar exits, not left behind by a drain that found nothing queued."""
    watch, remote = dirs
    d = Daemon(watch, f"file://{remote}")
    daemons.append(d)
    d.wait_for("daemon.ready")
    data = os.urandom(300_000)
    with open(watch / "step_9.pt", "wb") as f:
        f.write(data[:100_000])
        f.flush()
        d.proc.send_signal(signal.SIGTERM)
        waiting = d.wait_for("drain.waiting_for_save")
        assert waiting["checkpoints"] == ["step_9.pt"]
        f.write(data[100_000:])
    assert d.proc.wait(30) == 0
    done = d.wait_for("drain.done")
    assert done["outcome"] == "committed" and done["last_committed"]["name"] == "step_9.pt"
    (manifest,) = assert_invariant(remote)
    assert manifest.name == "step_9.pt" and manifest.size == len(data)


def test_sigterm_waits_for_a_save_under_a_temporary_name(
    dirs: tuple[Path, Path], daemons: list[Daemon]
) -> None:
    """``atomic_save`` writes ``.<name>.<random>.tmp`` and renames it into place when whole:
    a drain that starts meanwhile waits for it as for any save under way."""
    watch, remote = dirs
    d = Daemon(watch, f"file://{remote}")
    daemons.append(d)
    d.wait_for("daemon.ready")
    data = os.urandom(300_000)
    tmp = watch / ".step_11.pt.3f9a.tmp"
    with open(tmp, "wb") as f:
        f.write(data[:100_000])
        f.flush()
        d.proc.send_signal(signal.SIGTERM)
        waiting = d.wait_for("drain.waiting_for_save")
        assert waiting["checkpoints"] == [tmp.name]
        f.write(data[100_000:])
    os.replace(tmp, watch / "step_11.pt")
    assert d.proc.wait(30) == 0
    done = d.wait_for("drain.done")
    assert done["outcome"] == "committed" and done["last_committed"]["name"] == "step_11.pt"
    (manifest,) = assert_invariant(remote)
    assert manifest.name == "step_11.pt" and manifest.size == len(data)


def test_sigusr1_drains_and_keeps_running(dirs: tuple[Path, Path], daemons: list[Daemon]) -> None:
    watch, remote = dirs
    d = Daemon(watch, f"file://{remote}")
    daemons.append(d)
    d.wait_for("daemon.ready")
    d.proc.send_signal(signal.SIGUSR1)
    d.wait_for("drain.started", where=lambda e: e["kind"] == "usr1")
    d.wait_for("drain.done")
    # The trainer reads the notice and writes an emergency checkpoint: still committed.
    assert _notice_file(watch)["kind"] == "usr1"
    write_atomic(watch / "emergency_7.pt", os.urandom(200_000))
    d.wait_for("checkpoint.committed", where=checkpoint_is("emergency_7.pt"))
    assert d.proc.poll() is None
    assert d.terminate() == 0


def test_a_drain_ends_at_its_deadline_and_a_later_notice_drains_anew(
    dirs: tuple[Path, Path], daemons: list[Daemon]
) -> None:
    """Slurm's ``--signal=B:USR1@120`` then SIGTERM at the end: the second notice must get
    its own deadline and wait for the checkpoint written in between."""
    watch, remote = dirs
    d = Daemon(watch, f"file://{remote}", env={"CKPT_SIDECAR_SHUTDOWN_GRACE_SECONDS": "3"})
    daemons.append(d)
    d.wait_for("daemon.ready")
    d.proc.send_signal(signal.SIGUSR1)
    d.wait_for("drain.done")
    state, tick = "", threading.Event()
    for _ in range(150):  # the deadline passing is a matter of time: there is no event
        state = json.loads(admin_get(d.admin_port, "/v1/status")[1])["state"]
        if state == "running":
            break
        tick.wait(0.1)
    assert state == "running", "still draining after the drain's deadline"
    write_atomic(watch / "step_5.pt", os.urandom(500_000))
    d.proc.send_signal(signal.SIGTERM)
    assert d.proc.wait(timeout=30) == 0
    started = d.wait_for("drain.started", where=lambda e: e["kind"] == "terminate")
    assert _notice_file(watch)["deadline"] == started["deadline"], "the trainer was not told"
    done = d.named("drain.done")[-1]
    assert done["outcome"] == "committed" and done["last_committed"]["name"] == "step_5.pt"
    assert {m.name for m in assert_invariant(remote)} == {"step_5.pt"}


def test_drain_command_and_trigger_file(
    dirs: tuple[Path, Path], daemons: list[Daemon], tmp_path: Path
) -> None:
    watch, remote = dirs
    trigger = tmp_path / "drain-now"
    d = Daemon(
        watch, f"file://{remote}", env={"CKPT_SIDECAR_PREEMPTION__TRIGGER_FILE": str(trigger)}
    )
    daemons.append(d)
    d.wait_for("daemon.ready")
    write_atomic(watch / "step_1.pt", os.urandom(100_000))
    d.wait_for("checkpoint.committed")
    env = {k: v for k, v in os.environ.items() if not k.startswith("CKPT_SIDECAR_")}
    r = subprocess.run(
        [sys.executable, "-m", "sidecar", "drain", "--url", f"http://127.0.0.1:{d.admin_port}"],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
    )
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["drain"]["outcome"] == "committed"
    d.wait_for("drain.started", where=lambda e: e["source"] == "http")

    trigger.write_text("")
    d.wait_for("drain.started", where=lambda e: e["source"] == "file")
    assert d.proc.poll() is None
    assert d.terminate() == 0


def test_drain_command_exit_1_when_no_daemon(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("CKPT_SIDECAR_")}
    r = subprocess.run(
        [sys.executable, "-m", "sidecar", "drain", "--url", "http://127.0.0.1:9"],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
    )
    assert r.returncode == 1 and "cannot reach the daemon" in r.stderr


def test_aws_spot_notice_drains(
    dirs: tuple[Path, Path], daemons: list[Daemon], aws_metadata: FakeAwsMetadata
) -> None:
    watch, remote = dirs
    d = Daemon(
        watch,
        f"file://{remote}",
        env={
            "CKPT_SIDECAR_PREEMPTION__SOURCE": "aws",
            "AWS_EC2_METADATA_SERVICE_ENDPOINT": aws_metadata.url,
        },
    )
    daemons.append(d)
    d.wait_for("daemon.ready")
    write_atomic(watch / "step_2.pt", os.urandom(100_000))
    d.wait_for("checkpoint.committed")
    deadline = datetime.now(UTC).replace(microsecond=0) + timedelta(seconds=90)
    aws_metadata.interrupt("terminate", at=deadline)
    started = d.wait_for("drain.started", where=lambda e: e["source"] == "aws")
    assert started["kind"] == "terminate"
    notice = _notice_file(watch)
    assert notice["deadline"].startswith(deadline.strftime("%Y-%m-%dT%H:%M:%S"))
    d.wait_for("drain.done", where=lambda e: e["outcome"] == "committed")
    assert d.proc.poll() is None  # the machine ends at the deadline; we keep uploading
    assert d.terminate() == 0
    assert len(d.named("preemption.notice")) == 1  # polled every second, handled once


def test_a_stale_notice_file_is_removed_at_start(
    dirs: tuple[Path, Path], daemons: list[Daemon]
) -> None:
    watch, remote = dirs
    (watch / ".ckpt-sidecar-notice.json").write_text('{"source": "aws", "kind": "terminate"}')
    (watch / "step_3.replaced-20261202T150000").mkdir()  # restore --force moved it aside
    (watch / "step_3.replaced-20261202T150000" / "w.bin").write_bytes(b"old")
    d = Daemon(watch, f"file://{remote}")
    daemons.append(d)
    d.wait_for("drain.stale_notice_removed")
    assert not (watch / ".ckpt-sidecar-notice.json").exists()
    write_atomic(watch / "step_4.pt", os.urandom(1000))
    d.wait_for("checkpoint.committed", where=checkpoint_is("step_4.pt"))
    assert d.terminate() == 0
    assert {m.name for m in assert_invariant(remote)} == {"step_4.pt"}  # not the aside copy
