"""Admin listener and metrics, scraped from the daemon subprocess."""

from __future__ import annotations

import json
import os
import signal
import threading
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from tests.e2e.harness import Daemon, admin_get, scrape, write_atomic

TOKEN = "tkn-8c1f0e7d-never-logged"


def _post(port: int, path: str, body: bytes = b"") -> int:
    req = urllib.request.Request(f"http://127.0.0.1:{port}{path}", data=body, method="POST")
    try:
        with urllib.request.urlopen(req, timeout=60) as r:
            return int(r.status)
    except urllib.error.HTTPError as e:
        return int(e.code)


def test_metrics_move_with_uploads_and_unprotected_seconds(
    dirs: tuple[Path, Path], daemons: list[Daemon]
) -> None:
    watch, remote = dirs
    d = Daemon(
        watch,
        f"file://{remote}",
        env={
            "CKPT_SIDECAR_UPLOAD__MAX_BANDWIDTH_BYTES_PER_SECOND": str(1024 * 1024),
            "CKPT_SIDECAR_ADMIN__TOKEN": TOKEN,
        },
    )
    daemons.append(d)
    d.wait_for("daemon.ready")
    port = d.admin_port
    before = scrape(port)
    assert before["ckpt_sidecar_unprotected_seconds{}"] == 0
    assert before["ckpt_sidecar_build_info{backend=file,version=0.1.0}"] == 1
    # Both outcomes exist from the start, so increase() sees the first missed drain.
    assert before["ckpt_sidecar_drains_total{outcome=missed}"] == 0
    assert before["ckpt_sidecar_drains_total{outcome=committed}"] == 0

    write_atomic(watch / "step_1.pt", os.urandom(3 * 1024 * 1024))  # ~3 s at 1 MiB/s
    d.wait_for("checkpoint.ready")
    # While it uploads, the newest complete checkpoint is not durable: the gauge rises.
    seen, tick = 0.0, threading.Event()
    while seen <= 0.5 and not d.named("checkpoint.committed"):
        seen = max(seen, scrape(port)["ckpt_sidecar_unprotected_seconds{}"])
        tick.wait(0.1)  # polling a gauge: there is no event to wait on
    assert seen > 0.5
    d.wait_for("checkpoint.committed")
    after = scrape(port)
    assert after["ckpt_sidecar_unprotected_seconds{}"] == 0
    assert after["ckpt_sidecar_uploaded_bytes_total{backend=file,result=ok}"] >= 3 * 1024 * 1024
    assert after["ckpt_sidecar_uploaded_files_total{backend=file,result=ok}"] >= 1
    assert after["ckpt_sidecar_checkpoints_committed_total{}"] == 1
    assert after["ckpt_sidecar_last_committed_step{}"] == 1
    assert after["ckpt_sidecar_commit_latency_seconds_count{}"] == 1

    d.proc.send_signal(signal.SIGUSR1)  # drain without exiting
    d.wait_for("drain.done")
    drained = scrape(port)
    assert drained["ckpt_sidecar_drains_total{outcome=committed}"] == 1
    assert drained["ckpt_sidecar_notices_total{kind=usr1,source=signal}"] == 1
    assert drained["ckpt_sidecar_notice_deadline_remaining_seconds{}"] == 0, "drain is over"
    status = json.loads(admin_get(port, "/v1/status")[1])
    assert status["state"] == "draining" and status["notice"]["source"] == "signal"
    assert (watch / ".ckpt-sidecar-notice.json").is_file()
    assert d.proc.poll() is None
    assert d.terminate() == 0
    assert not any(TOKEN in line for line in d.raw), "the admin token appeared in the logs"
    assert not (remote / ".ckpt-sidecar-notice.json").exists()

    # After a restart the newest commit's time is known before anything new is committed
    # (it read 0, "56 years ago", until the next commit).
    again = Daemon(watch, f"file://{remote}")
    daemons.append(again)
    again.wait_for("daemon.ready")
    restarted = scrape(again.admin_port)
    assert restarted["ckpt_sidecar_last_commit_timestamp_seconds{}"] == pytest.approx(
        after["ckpt_sidecar_last_commit_timestamp_seconds{}"], abs=1.0
    )
    assert restarted["ckpt_sidecar_last_committed_step{}"] == 1


def test_endpoints_and_methods(dirs: tuple[Path, Path], daemons: list[Daemon]) -> None:
    watch, remote = dirs
    d = Daemon(watch, f"file://{remote}")
    daemons.append(d)
    d.wait_for("daemon.ready")
    port = d.admin_port
    assert admin_get(port, "/healthz")[0] == 200
    code, body = admin_get(port, "/readyz")
    assert code == 200 and json.loads(body)["ready"] is True
    assert admin_get(port, "/nope")[0] == 404
    assert admin_get(port, "/v1/drain")[0] == 405
    assert _post(port, "/metrics") == 405
    assert _post(port, "/v1/flush", b"x" * (65 * 1024)) == 413
    assert _post(port, "/v1/flush") == 202
    status = json.loads(admin_get(port, "/v1/status")[1])
    assert {"state", "notice", "queue", "in_flight", "last_committed"} <= set(status)
    assert d.terminate() == 0


def test_readyz_reports_a_permanent_error(tmp_path: Path, daemons: list[Daemon]) -> None:
    watch = tmp_path / "w"
    watch.mkdir()
    remote = tmp_path / "ro"
    remote.mkdir()
    remote.chmod(0o500)
    try:
        if os.access(remote, os.W_OK):  # root ignores modes: use a path under a file instead
            remote = tmp_path / "a-file" / "remote"
            (tmp_path / "a-file").write_text("not a folder")
        d = Daemon(watch, f"file://{remote}")
        daemons.append(d)
        d.wait_for("storage.permanent_error")
        port = d.admin_port
        code, body = admin_get(port, "/readyz")
        assert code == 503 and json.loads(body)["problems"]
        tries, tick = 0.0, threading.Event()
        for _ in range(300):  # retried every 5 s: wait for a second try (no event to wait on)
            tries = sum(
                v
                for k, v in scrape(port).items()
                if k.startswith("ckpt_sidecar_errors_total{") and "operation=list_manifests" in k
            )
            if tries >= 2:
                break
            tick.wait(0.1)
        assert tries >= 2
        logged = [e["operation"] for e in d.named("storage.permanent_error")]
        assert sorted(logged) == sorted(set(logged)), f"logged again on a retry: {logged}"
        assert d.terminate() in (0, 4)
    finally:
        (tmp_path / "ro").chmod(0o700)
