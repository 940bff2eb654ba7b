"""Store faults between the daemon and S3 (SeaweedFS): a 60 s outage, a storm of 503 SlowDown,
connections reset in the middle of parts, and a manifest write whose reply is lost.

Each ends the same way: nothing lost (the newest checkpoint commits once the fault ends, every
other one is committed or logged as superseded), nothing committed twice, every manifest true,
the queue empty, and every retry bounded and visible in the log and in ``/metrics``.
"""

from __future__ import annotations

import os
import threading
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlsplit

import pytest

from tests.e2e.harness import Daemon, checkpoint_is, cli, scrape, write_atomic
from tests.faults.s3remote import Remote
from tests.servers.faultproxy import FaultProxy
from tests.servers.seaweedfs import S3Proxy, S3Server, new_bucket

MiB = 1024 * 1024
MAX_ATTEMPTS = 8
ENV = {
    "CKPT_SIDECAR_UPLOAD__MAX_ATTEMPTS": str(MAX_ATTEMPTS),
    "CKPT_SIDECAR_UPLOAD__BACKOFF_MAX_SECONDS": "2",
    "CKPT_SIDECAR_RETENTION__KEEP_LAST": "50",
    "CKPT_SIDECAR_WATCH__SETTLE_SECONDS": "0.2",
    "AWS_MAX_ATTEMPTS": "2",  # botocore's own retries: one, so ours carry the policy
}


@pytest.fixture
def remote(s3_server: S3Server) -> Iterator[Remote]:
    r = Remote(s3_server, new_bucket(s3_server, "faults"))
    yield r
    r.close()


@pytest.fixture
def tcp_proxy(s3_server: S3Server) -> Iterator[FaultProxy]:
    u = urlsplit(s3_server.endpoint_url)
    assert u.hostname and u.port
    proxy = FaultProxy(u.hostname, u.port)
    yield proxy
    proxy.close()


def start(watch: Path, remote: Remote, endpoint: str, daemons: list[Daemon]) -> Daemon:
    d = Daemon(watch, remote.url, env={**remote.env(endpoint), **ENV})
    daemons.append(d)
    d.wait_for("daemon.ready", timeout=60)
    return d


def checkpoint(watch: Path, step: int, size: int) -> bytes:
    data = os.urandom(size)
    write_atomic(watch / f"step_{step}.pt", data)
    return data


def assert_recovered(
    d: Daemon, remote: Remote, written: dict[str, bytes], tmp_path: Path, *, retried: bool = True
) -> None:
    """The end state every fault must reach; returns after a drain (SIGTERM, exit 0)."""
    newest = max(written, key=lambda n: int(n.split("_")[1].split(".")[0]))
    d.wait_for("checkpoint.committed", timeout=120, where=checkpoint_is(newest))
    for name in written:  # nothing lost: committed, or dropped for a newer one and logged
        d.wait_for(("checkpoint.committed", "checkpoint.superseded"), 60, checkpoint_is(name))
    metrics = scrape(d.admin_port)
    assert metrics["ckpt_sidecar_queue_checkpoints{}"] == 0
    retries = {k: v for k, v in metrics.items() if k.startswith("ckpt_sidecar_retries_total")}
    logged = d.named("upload.retry")
    assert bool(logged) == retried and sum(retries.values()) == len(logged), (retries, logged)
    assert all(1 <= e["attempt"] < MAX_ATTEMPTS for e in logged), "retries are bounded"
    assert d.terminate() == 0

    committed = Counter(e["checkpoint"] for e in d.named("checkpoint.committed"))
    assert all(n == 1 for n in committed.values()), f"committed twice: {committed}"
    superseded = {e["checkpoint"] for e in d.named("checkpoint.superseded")}
    for name in written:
        assert name in committed or name in superseded, f"{name} neither committed nor superseded"
    found = remote.assert_invariant()
    assert {m.name for m in found} == set(committed)
    assert all(m.generation == 0 for m in found)
    for m in found:
        assert remote.read(m.files[0].key) == written[m.name]

    target = tmp_path / "restored"
    r = cli("restore", "--to", str(target), "--destination", remote.url, env=remote.env())
    assert r.returncode == 0, r.stderr
    assert (target / newest).read_bytes() == written[newest]


@pytest.mark.slow
def test_a_sixty_second_outage(
    dirs: tuple[Path, Path],
    daemons: list[Daemon],
    tmp_path: Path,
    remote: Remote,
    tcp_proxy: FaultProxy,
) -> None:
    """The store is unreachable for 60 s (refused, pooled connections reset) while the trainer
    writes two checkpoints; retries run out, the checkpoint stays queued, then commits."""
    watch, _ = dirs
    d = start(watch, remote, tcp_proxy.url, daemons)
    written = {"step_1.pt": checkpoint(watch, 1, 12 * MiB)}
    d.wait_for("checkpoint.committed", timeout=60, where=checkpoint_is("step_1.pt"))

    began = time.monotonic()
    tcp_proxy.outage()
    written["step_2.pt"] = checkpoint(watch, 2, 12 * MiB)
    failed = d.wait_for("checkpoint.upload_failed", timeout=60, where=checkpoint_is("step_2.pt"))
    assert failed["action"] == "retried later"
    written["step_3.pt"] = checkpoint(watch, 3, 12 * MiB)
    d.wait_for("checkpoint.ready", where=checkpoint_is("step_3.pt"))
    assert tcp_proxy.faults.counts["refused"] > 0
    metrics = scrape(d.admin_port)
    assert metrics["ckpt_sidecar_unprotected_seconds{}"] > 0
    assert any(k.startswith("ckpt_sidecar_errors_total{") and v for k, v in metrics.items())
    threading.Event().wait(max(0.0, 60 - (time.monotonic() - began)))  # the outage itself
    assert not d.named("checkpoint.committed")[1:], "nothing commits while the store is away"
    tcp_proxy.heal()
    assert_recovered(d, remote, written, tmp_path)


def test_a_storm_of_503_slowdown(
    dirs: tuple[Path, Path],
    daemons: list[Daemon],
    tmp_path: Path,
    remote: Remote,
    s3_proxy: S3Proxy,
) -> None:
    """Forty writes in a row answered 503 SlowDown, across the parts of a 20 MiB file."""
    watch, _ = dirs
    d = start(watch, remote, s3_proxy.endpoint_url, daemons)
    s3_proxy.refuse(f"PUT /{remote.bucket}/", times=40, status=503, code="SlowDown")
    written = {"step_1.pt": checkpoint(watch, 1, 20 * MiB)}
    assert_recovered(d, remote, written, tmp_path)
    assert sum(r.status == 503 for r in s3_proxy.requests) == 40
    assert any("SlowDown" in e["error"] for e in d.named("upload.retry"))


def test_connections_reset_in_the_middle_of_parts(
    dirs: tuple[Path, Path],
    daemons: list[Daemon],
    tmp_path: Path,
    remote: Remote,
    tcp_proxy: FaultProxy,
) -> None:
    """Every connection is reset after 3 MiB until six resets happened: parts (8 MiB) die in
    the middle of their bodies; nothing half-sent is ever committed."""
    watch, _ = dirs
    d = start(watch, remote, tcp_proxy.url, daemons)
    tcp_proxy.set(reset_after_bytes=3 * MiB)
    written = {"step_1.pt": checkpoint(watch, 1, 20 * MiB)}
    tcp_proxy.wait_count("reset", 6)
    written["step_2.pt"] = checkpoint(watch, 2, 6 * MiB)
    tcp_proxy.wait_count("reset", 8)
    tcp_proxy.heal()
    assert_recovered(d, remote, written, tmp_path)


def test_a_manifest_write_whose_reply_is_lost_commits_once(
    dirs: tuple[Path, Path],
    daemons: list[Daemon],
    tmp_path: Path,
    remote: Remote,
    s3_proxy: S3Proxy,
) -> None:
    """The store wrote the manifest but the reply never came: the retry meets the create-only
    precondition, compares, and reports the commit once; no second generation appears."""
    watch, _ = dirs
    d = start(watch, remote, s3_proxy.endpoint_url, daemons)
    s3_proxy.lose(f"PUT /{remote.bucket}/{remote.prefix}/.ckpt-sidecar/manifests/", times=1)
    written = {"step_1.pt": checkpoint(watch, 1, 1 * MiB)}
    assert_recovered(d, remote, written, tmp_path, retried=False)  # botocore's own retry
    manifest_puts = [r for r in s3_proxy.requests if r.method == "PUT" and "/manifests/" in r.path]
    assert len(manifest_puts) >= 2, "the lost reply was retried"
    assert not d.named("checkpoint.manifest_conflict")
