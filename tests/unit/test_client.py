"""``sidecar.client``: what a training script relies on.

The notice file is written here exactly as the daemon writes it (``sidecar.drain``'s name,
``sidecar.manifest.rfc3339`` times); ``/v1/status`` is a real HTTP server on 127.0.0.1.
The examples' end-to-end tests (``tests/examples/``) use the same calls beside the daemon.
"""

from __future__ import annotations

import json
import os
import socket
import stat
import sys
import threading
import time
import urllib.error
import urllib.request
import warnings
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import IO, Any

import pytest

from sidecar import client
from sidecar.client import (
    atomic_save,
    daemon_status,
    default_admin_url,
    latest_local_checkpoint,
    open_admin,
    preemption_notice,
    wait_for_durable,
)
from sidecar.drain import NOTICE_FILE
from sidecar.manifest import rfc3339
from sidecar.watch import scan
from sidecar.watch.layouts import is_temporary


def _write_notice(folder: Path, source: str = "aws", kind: str = "terminate") -> datetime:
    """What the daemon's drain writes (temporary name, then rename); the deadline."""
    now = time.time()
    doc = {
        "source": source,
        "kind": kind,
        "deadline": rfc3339(now + 90),
        "received_at": rfc3339(now),
    }
    tmp = folder / f"{NOTICE_FILE}.ckpt-sidecar-tmp"
    tmp.write_text(json.dumps(doc))
    os.replace(tmp, folder / NOTICE_FILE)
    return datetime.fromtimestamp(now + 90, UTC)


# -- atomic_save ----------------------------------------------------------------------------
def test_writer_gets_a_hidden_tmp_file_in_the_same_folder_that_the_sidecar_ignores(
    tmp_path: Path,
) -> None:
    seen: list[Path] = []

    def writer(f: IO[bytes]) -> None:
        seen.extend(tmp_path.iterdir())  # while writing: only the temporary name exists
        f.write(b"weights")

    assert atomic_save(writer, tmp_path / "step_5.pt") == tmp_path / "step_5.pt"
    assert (tmp_path / "step_5.pt").read_bytes() == b"weights"
    [tmp] = seen
    assert tmp.parent == tmp_path and tmp.name.startswith(".") and is_temporary(tmp.name)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["step_5.pt"]


def test_failed_writer_leaves_the_old_file_and_no_temporary(tmp_path: Path) -> None:
    target = tmp_path / "last.ckpt"
    target.write_bytes(b"old")

    def writer(f: IO[bytes]) -> None:
        f.write(b"half of the new one")
        raise RuntimeError("disk full")

    with pytest.raises(RuntimeError, match="disk full"):
        atomic_save(writer, target)
    assert target.read_bytes() == b"old"
    assert [p.name for p in tmp_path.iterdir()] == ["last.ckpt"]


def test_replaces_an_existing_file_and_keeps_the_usual_mode(tmp_path: Path) -> None:
    target = tmp_path / "last.ckpt"
    target.write_bytes(b"old")
    old_umask = os.umask(0o022)
    try:
        atomic_save(lambda f: f.write(b"new"), target)
    finally:
        os.umask(old_umask)
    assert target.read_bytes() == b"new"
    assert stat.S_IMODE(target.stat().st_mode) == 0o644  # group can read: a sidecar UID can


def test_a_writer_that_closes_its_file_is_fine(tmp_path: Path) -> None:
    def writer(f: IO[bytes]) -> None:
        f.write(b"all")
        f.close()

    atomic_save(writer, tmp_path / "step_2.pt")
    assert (tmp_path / "step_2.pt").read_bytes() == b"all"


def test_path_writer_and_one_that_adds_its_own_extension(tmp_path: Path) -> None:
    atomic_save(
        lambda p: Path(p).write_bytes(b"st"), tmp_path / "m.safetensors", writer_takes_path=True
    )
    assert (tmp_path / "m.safetensors").read_bytes() == b"st"

    def adds_suffix(p: str) -> None:
        Path(p + ".npz").write_bytes(b"x")

    def makes_a_folder(p: str) -> None:
        Path(p).mkdir()
        (Path(p) / "config.json").write_text("{}")

    for writer in (adds_suffix, makes_a_folder):
        with pytest.raises(FileNotFoundError, match="exactly to the path"):
            atomic_save(writer, tmp_path / "arrays.npz", writer_takes_path=True)
    assert [p.name for p in tmp_path.iterdir()] == ["m.safetensors"]


def test_objects_go_through_torch_save_and_load_back_equal(tmp_path: Path) -> None:
    with warnings.catch_warnings():  # torch warns at import when numpy is missing
        warnings.simplefilter("ignore")
        import torch

    torch.manual_seed(0)
    model = torch.nn.Linear(4, 2)
    atomic_save({"model": model.state_dict(), "step": 7}, tmp_path / "step_7.pt")
    atomic_save(model, tmp_path / "module.pt")  # callable, but an object to save
    back = torch.load(tmp_path / "step_7.pt", weights_only=True)
    assert back["step"] == 7
    assert all(torch.equal(back["model"][k], v) for k, v in model.state_dict().items())
    whole = torch.load(tmp_path / "module.pt", weights_only=False)
    assert torch.equal(whole.weight, model.weight)


def test_an_object_without_torch_says_what_to_do(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "torch", None)  # import torch -> ImportError
    with pytest.raises(ImportError, match="pass a writer function"):
        atomic_save({"step": 1}, tmp_path / "step_1.pt")
    assert list(tmp_path.iterdir()) == []


# -- preemption_notice ------------------------------------------------------------------------
def test_no_notice_file_means_no_notice(tmp_path: Path) -> None:
    assert preemption_notice(tmp_path) is None
    assert preemption_notice(tmp_path / "does-not-exist") is None


def test_reads_the_daemons_notice_file(tmp_path: Path) -> None:
    deadline = _write_notice(tmp_path)
    n = preemption_notice(tmp_path)
    assert n is not None and (n.source, n.kind) == ("aws", "terminate")
    assert abs((n.deadline - deadline).total_seconds()) < 0.001
    assert 85 < n.seconds_left() <= 90
    assert n.seconds_left(deadline - timedelta(seconds=30)) == pytest.approx(30, abs=0.001)
    assert n.received_at <= datetime.now(UTC)


def test_parses_once_per_file_version_and_sees_a_new_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _write_notice(tmp_path, kind="terminate")
    reads: list[Path] = []
    real = client._read_notice_file

    def counting(path: Path, mtime: float) -> client.Notice:
        reads.append(path)
        return real(path, mtime)

    monkeypatch.setattr(client, "_read_notice_file", counting)
    first = [preemption_notice(tmp_path) for _ in range(100)]
    assert len(reads) == 1 and all(n is first[0] for n in first)
    _write_notice(tmp_path, source="gcp", kind="preempt")  # rename: new inode
    n = preemption_notice(tmp_path)
    assert n is not None and (n.source, n.kind) == ("gcp", "preempt") and len(reads) == 2


def test_an_unreadable_notice_file_still_means_act_now(tmp_path: Path) -> None:
    (tmp_path / NOTICE_FILE).write_text("{not json")
    n = preemption_notice(tmp_path)
    assert n is not None and n.source == "unknown" and n.seconds_left() <= 0


def test_a_notice_from_before_this_process_started_is_a_previous_runs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A VM stopped and started again keeps its disk: the last run's notice, its deadline long
    past, must not stop the new trainer at its first step."""
    old = {"source": "aws", "kind": "terminate", "deadline": rfc3339(time.time() - 3600)}
    (tmp_path / NOTICE_FILE).write_text(json.dumps({**old, "received_at": old["deadline"]}))
    monkeypatch.setattr(client, "_STARTED", time.time())
    assert preemption_notice(tmp_path) is None
    _write_notice(tmp_path)  # this run's
    assert preemption_notice(tmp_path) is not None
    # Received now with a deadline already past (a sidecar that read the cloud's notice
    # late): this run's, act at once.
    late = {**old, "received_at": rfc3339(time.time())}
    (tmp_path / NOTICE_FILE).write_text(json.dumps(late))
    n = preemption_notice(tmp_path)
    assert n is not None and n.seconds_left() < 0


def test_default_folder_and_admin_url_follow_the_daemons_variables(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CKPT_SIDECAR_WATCH__PATH", str(tmp_path))
    _write_notice(tmp_path, source="signal", kind="term")
    n = preemption_notice()
    assert n is not None and n.source == "signal"
    assert default_admin_url({}) == "http://127.0.0.1:9477"
    env = {"CKPT_SIDECAR_ADMIN__HOST": "0.0.0.0", "CKPT_SIDECAR_ADMIN__PORT": "9500"}
    assert default_admin_url(env) == "http://127.0.0.1:9500"


# -- /v1/status ---------------------------------------------------------------------------------
class _Redirect(Exception):
    def __init__(self, location: str) -> None:
        self.location = location


class _Status:
    """A stand-in for the daemon's admin listener: GET /v1/status answers ``doc``."""

    def __init__(self) -> None:
        self.doc: dict[str, Any] = {"state": "running", "notice": None, "last_committed": None}
        self.requests = 0
        self.on_request: Any = None
        status = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                status.requests += 1
                if status.on_request:
                    try:
                        status.on_request(status)
                    except _Redirect as r:
                        self.send_response(302)
                        self.send_header("Location", r.location)
                        self.send_header("Content-Length", "0")
                        self.end_headers()
                        return
                body = json.dumps(status.doc).encode()
                code = 200 if self.path == "/v1/status" else 404
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(5)


@pytest.fixture
def status() -> Iterator[_Status]:
    s = _Status()
    yield s
    s.close()


@pytest.fixture
def dead_url() -> str:
    """A loopback port with nothing listening."""
    s = _Status()
    url = s.url
    s.close()
    return url


def test_notice_from_status_when_the_folder_is_not_shared(
    tmp_path: Path, status: _Status, dead_url: str
) -> None:
    assert preemption_notice(tmp_path, admin_url=status.url) is None
    status.doc["notice"] = {
        "source": "http",
        "kind": "drain",
        "deadline": rfc3339(time.time() + 30),
        "received_at": rfc3339(time.time()),
    }
    n = preemption_notice(tmp_path, admin_url=status.url, status_interval=0)
    assert n is not None and (n.source, n.kind) == ("http", "drain")
    asked = status.requests
    for _ in range(50):  # every step: the status is asked at most every status_interval
        preemption_notice(tmp_path, admin_url=status.url, status_interval=60)
    assert status.requests == asked
    assert preemption_notice(tmp_path, admin_url=dead_url) is None  # unreachable: no notice


def test_a_sidecar_that_never_answers_costs_the_training_loop_little(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A sidecar that accepts connections but does not answer (stopped, starved): an ask
    waits at most STATUS_TIMEOUT_SECONDS and the next comes only after the back-off, not at
    every step (it cost about 1 s a step)."""
    asks: list[float | None] = []
    real = client.daemon_status

    def counted(url: str | None = None, timeout: float = 2.0) -> dict[str, Any] | None:
        asks.append(timeout)
        return real(url, timeout)

    monkeypatch.setattr(client, "daemon_status", counted)
    with socket.socket() as hung:
        hung.bind(("127.0.0.1", 0))
        hung.listen(64)  # the kernel completes connections; nothing ever replies
        url = f"http://127.0.0.1:{hung.getsockname()[1]}"
        for _ in range(50):  # 50 steps, asking "every step"
            assert preemption_notice(tmp_path, admin_url=url, status_interval=0) is None
        assert asks == [client.STATUS_TIMEOUT_SECONDS]
        later = time.monotonic() + client.UNREACHABLE_BACKOFF_SECONDS
        monkeypatch.setattr(time, "monotonic", lambda: later)
        assert preemption_notice(tmp_path, admin_url=url, status_interval=0) is None
        assert len(asks) == 2, "asked again after the back-off"


def test_wait_for_durable_returns_once_the_step_is_committed(status: _Status) -> None:
    def commit_on_third(s: _Status) -> None:
        if s.requests >= 3:
            s.doc["last_committed"] = {"name": "step_40.pt", "step": 40, "committed_at": "x"}

    status.on_request = commit_on_third
    assert wait_for_durable(40, timeout=10, admin_url=status.url, poll_interval=0.01)
    assert status.requests == 3


def test_wait_for_durable_gives_up_at_the_timeout(status: _Status, dead_url: str) -> None:
    status.doc["last_committed"] = {"name": "step_30.pt", "step": 30, "committed_at": "x"}
    for url in (status.url, dead_url):
        started = time.monotonic()
        assert not wait_for_durable(40, timeout=0.5, admin_url=url, poll_interval=0.05)
        assert 0.5 <= time.monotonic() - started < 3


# -- latest_local_checkpoint ---------------------------------------------------------------------
def test_newest_plain_checkpoint_skips_temporary_hidden_and_replaced(tmp_path: Path) -> None:
    for name in ["step_5.pt", "step_40.pt", "notes.txt", "step_90.pt.tmp", ".step_95.pt.ab.tmp"]:
        (tmp_path / name).write_bytes(b"x")
    (tmp_path / "step_40.pt.replaced-20261202T100000Z").write_bytes(b"x")
    for folder in ["step_41.replaced-20261202T100000Z", "step_97.dirty"]:  # "step*" folders
        (tmp_path / folder).mkdir()
        (tmp_path / folder / "model.bin").write_bytes(b"x")
    (tmp_path / ".ckpt-sidecar-restore-1234").mkdir()
    (tmp_path / ".ckpt-sidecar-restore-1234" / "step_99.pt").write_bytes(b"x")
    assert latest_local_checkpoint(tmp_path) == tmp_path / "step_40.pt"


def test_newest_dcp_checkpoint_is_the_newest_with_metadata(tmp_path: Path) -> None:
    for step, done in [(100, True), (150, True), (200, False)]:
        d = tmp_path / f"step_{step:06d}"
        d.mkdir()
        (d / "__0_0.distcp").write_bytes(b"x")
        if done:
            (d / ".metadata").write_bytes(b"m")
    (tmp_path / "step_000200" / ".metadata.tmp").write_bytes(b"m")  # DCP mid-rename
    assert latest_local_checkpoint(tmp_path, layout="torch-dcp") == tmp_path / "step_000150"


def test_an_unreadable_folder_is_skipped_as_the_daemon_does(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A root-owned lost+found at an NVMe mount point matches torch-dcp's "any folder"; the
    trainer resumes from the real checkpoint instead of crashing (as root, where a mode
    cannot deny it, the refusal is simulated)."""
    (tmp_path / "lost+found").mkdir()
    done = tmp_path / "step_000100"
    done.mkdir()
    (done / ".metadata").write_bytes(b"m")
    real = scan.scan_entry

    def refuse(path: Path, *args: Any) -> Any:
        if path.name == "lost+found":
            raise PermissionError(13, "Permission denied", str(path))
        return real(path, *args)

    monkeypatch.setattr(scan, "scan_entry", refuse)
    assert latest_local_checkpoint(tmp_path, layout="torch-dcp") == done


def test_step_regex_and_ties(tmp_path: Path) -> None:
    (tmp_path / "step=120-epoch=3.ckpt").write_bytes(b"x")
    (tmp_path / "step=90-epoch=4.ckpt").write_bytes(b"x")
    assert latest_local_checkpoint(tmp_path) == tmp_path / "step=90-epoch=4.ckpt"  # last integer
    got = latest_local_checkpoint(tmp_path, step_regex=r"step=(\d+)")
    assert got == tmp_path / "step=120-epoch=3.ckpt"
    old, new = tmp_path / "model.pt", tmp_path / "last.pt"
    old.write_bytes(b"x")
    new.write_bytes(b"x")
    os.utime(old, ns=(1, 1))
    (tmp_path / "step=120-epoch=3.ckpt").unlink()
    (tmp_path / "step=90-epoch=4.ckpt").unlink()
    assert latest_local_checkpoint(tmp_path) == new  # no step in either: the later one


def test_nothing_to_resume_from(tmp_path: Path) -> None:
    assert latest_local_checkpoint(tmp_path) is None
    assert latest_local_checkpoint(tmp_path / "missing") is None
    with pytest.raises(KeyError):
        latest_local_checkpoint(tmp_path, layout="no-such-layout")


def test_the_status_is_asked_directly_even_with_a_proxy_in_the_environment(
    status: _Status, dead_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    for var in ("no_proxy", "NO_PROXY"):
        monkeypatch.delenv(var, raising=False)
    for var in ("http_proxy", "HTTP_PROXY", "https_proxy", "HTTPS_PROXY"):
        monkeypatch.setenv(var, dead_url)  # a proxy that is down, or one that would keep it
    monkeypatch.setattr(urllib.request, "_opener", None)  # urlopen's, built at its first call
    got = daemon_status(status.url, timeout=5)
    assert got is not None and got["state"] == "running"


def test_a_redirect_from_the_admin_port_is_not_followed_with_the_token(status: _Status) -> None:
    elsewhere = _Status()
    try:
        seen: list[str | None] = []

        def redirect(s: _Status) -> None:
            raise _Redirect(elsewhere.url + "/v1/status")

        status.on_request = redirect
        elsewhere.on_request = lambda s: seen.append("asked")
        req = urllib.request.Request(
            status.url + "/v1/status", headers={"Authorization": "Bearer tkn-secret"}
        )
        with pytest.raises(urllib.error.HTTPError) as e:
            open_admin(req, 5)
        assert e.value.code == 302
        assert seen == [], "the request (and its token) went on to another address"
    finally:
        elsewhere.close()
