"""SIGKILL at chosen moments rather than random ones: a request is held at the S3 proxy, the
process is killed while it waits, and the request is then dropped or let through to the store
(the write may land after its writer died). Moments: between a checkpoint's last object and its
manifest, during retention's deletes, and during a restore's downloads.

After each kill: every manifest names only objects that exist with the recorded size and
CRC32C, nothing is committed twice, a restart converges, and a restore verifies.
"""

from __future__ import annotations

import os
import random
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.e2e.harness import Daemon, checkpoint_is, cli, same_tree, spawn_cli
from tests.faults.s3remote import Remote
from tests.servers.seaweedfs import S3Proxy, S3Server, new_bucket

ENV = {"CKPT_SIDECAR_WATCH__SETTLE_SECONDS": "0.2", "AWS_MAX_ATTEMPTS": "2"}
KiB = 1024
KEEP_ALL = {"CKPT_SIDECAR_RETENTION__KEEP_LAST": "100"}


@pytest.fixture
def remote(s3_server: S3Server) -> Iterator[Remote]:
    r = Remote(s3_server, new_bucket(s3_server, "kills"))
    yield r
    r.close()


def folder(watch: Path, step: int, rng: random.Random, files: int = 3) -> list[str]:
    """A checkpoint folder written under a temporary name, then renamed; its object keys."""
    tmp = watch / f"step_{step}.partial"
    tmp.mkdir()
    for i in range(files):
        (tmp / f"shard{i}.bin").write_bytes(os.urandom(rng.randint(64, 1024) * KiB))
    os.replace(tmp, watch / f"step_{step}")
    return [f"step_{step}/shard{i}.bin" for i in range(files)]


def start(watch: Path, remote: Remote, endpoint: str, daemons: list[Daemon], **env: str) -> Daemon:
    d = Daemon(watch, remote.url, env={**remote.env(endpoint), **ENV, **env})
    daemons.append(d)
    d.wait_for("daemon.ready", timeout=60)
    return d


def settled(d: Daemon, name: str) -> str:
    """Wait until ``name`` is committed by this daemon or found already committed; which."""
    ev = d.wait_for(
        ("checkpoint.committed", "checkpoint.already_committed"), 60, checkpoint_is(name)
    )
    return str(ev["event"])


@pytest.mark.parametrize("reaches_store", [False, True], ids=["dropped", "lands-after-kill"])
def test_kill_between_the_last_object_and_the_manifest(
    reaches_store: bool,
    dirs: tuple[Path, Path],
    daemons: list[Daemon],
    remote: Remote,
    s3_proxy: S3Proxy,
) -> None:
    watch, _ = dirs
    rng = random.Random(reaches_store)
    manifests = f"PUT /{remote.bucket}/{remote.prefix}/.ckpt-sidecar/manifests/"
    trials = 4
    for step in range(1, trials + 2):
        d = start(watch, remote, s3_proxy.endpoint_url, daemons, **KEEP_ALL)
        if step > 1:  # the restart converges on the checkpoint killed before its manifest
            outcome = settled(d, f"step_{step - 1}")
            assert outcome == (
                "checkpoint.already_committed" if reaches_store else "checkpoint.committed"
            )
        if step > trials:
            assert d.terminate() == 0
            break
        held = s3_proxy.hold(f"{manifests}step_{step}.json")
        keys = folder(watch, step, rng)
        held.wait()
        assert set(keys) <= remote.keys(), "the manifest is written after every object"
        d.kill()
        held.release(forward=reaches_store)
        found = {m.name for m in remote.assert_invariant()}
        assert (f"step_{step}" in found) == reaches_store
    found_all = remote.assert_invariant()
    assert sorted(m.name for m in found_all) == [f"step_{i}" for i in range(1, trials + 1)]
    assert all(m.generation == 0 for m in found_all), "a checkpoint committed twice"


def _age_at_least(remote: Remote, prefix: str, seconds: float) -> None:
    """Wait until every object under ``prefix`` is ``seconds`` old by the store's clock."""
    while True:
        listed = remote.client.list_objects_v2(
            Bucket=remote.bucket, Prefix=f"{remote.prefix}/{prefix}"
        )
        newest = max(o["LastModified"].timestamp() for o in listed["Contents"])
        left = newest + seconds - time.time()
        if left <= 0:
            return
        time.sleep(left)  # the age is the condition itself: nothing to wait on instead


def test_kill_during_retention_deletes_then_the_sweep_removes_orphans(
    dirs: tuple[Path, Path],
    daemons: list[Daemon],
    tmp_path: Path,
    remote: Remote,
    s3_proxy: S3Proxy,
) -> None:
    """Retention deletes the manifest first (the tombstone), then the objects. Kill it right
    after the tombstone lands, and again between two object deletes: no manifest ever names a
    missing object, restore verifies, and the orphan sweep later removes what was left."""
    watch, _ = dirs
    rng = random.Random(5)
    keep = {"CKPT_SIDECAR_RETENTION__KEEP_LAST": "2"}
    d = start(watch, remote, s3_proxy.endpoint_url, daemons, **keep)
    objects = {step: folder(watch, step, rng) for step in (1, 2)}
    settled(d, "step_2")
    deletes = f"DELETE /{remote.bucket}/{remote.prefix}/"

    # 1: killed just after the tombstone (step_1's manifest delete) reached the store.
    held = s3_proxy.hold(deletes)
    objects[3] = folder(watch, 3, rng)
    assert held.wait().endswith("/.ckpt-sidecar/manifests/step_1.json"), "tombstone first"
    d.kill()
    held.release(forward=True)
    assert {m.name for m in remote.assert_invariant()} == {"step_2", "step_3"}
    assert set(objects[1]) <= remote.keys()  # orphans now: no manifest names them

    # 2: killed between two object deletes of step_2.
    d = start(watch, remote, s3_proxy.endpoint_url, daemons, **keep)
    settled(d, "step_3")
    held = s3_proxy.hold(f"{deletes}step_2/")
    objects[4] = folder(watch, 4, rng)
    held.wait()
    d.kill()
    held.release(forward=False)
    assert {m.name for m in remote.assert_invariant()} == {"step_3", "step_4"}
    r = cli("restore", "--to", str(tmp_path / "r"), "--destination", remote.url, env=remote.env())
    assert r.returncode == 0, r.stderr
    assert same_tree(watch / "step_4", tmp_path / "r" / "step_4")

    # The sweep (objects older than 2 s here; a day by default) removes both sets of orphans.
    _age_at_least(remote, "step_2/", 3.0)
    d = start(
        watch,
        remote,
        s3_proxy.endpoint_url,
        daemons,
        **keep,
        CKPT_SIDECAR_RETENTION__ORPHAN_SWEEP_HOURS=str(2 / 3600),
    )
    swept = d.wait_for("orphans.swept", timeout=60)
    outranked = {e["checkpoint"] for e in d.named("checkpoint.outranked")}
    assert outranked == {"step_1", "step_2"}, "old local checkpoints are not uploaded again"
    left = remote.keys()
    assert not any(k.startswith(("step_1/", "step_2/")) for k in left), sorted(left)
    assert swept["deleted"] >= len(objects[1]) + 1
    assert set(objects[3] + objects[4]) <= left
    assert {m.name for m in remote.assert_invariant()} == {"step_3", "step_4"}
    assert d.terminate() == 0


def test_restore_killed_while_downloading(
    dirs: tuple[Path, Path],
    daemons: list[Daemon],
    tmp_path: Path,
    remote: Remote,
    s3_proxy: S3Proxy,
) -> None:
    """Killed while the second, then the third object downloads: nothing appears in the
    target, and the next restore produces the checkpoint exactly."""
    watch, _ = dirs
    d = start(watch, remote, remote.server.endpoint_url, daemons)
    folder(watch, 1, random.Random(9), files=4)
    settled(d, "step_1")
    assert d.terminate() == 0
    target = tmp_path / "t"
    env = remote.env(s3_proxy.endpoint_url)
    for shard in (1, 2):
        held = s3_proxy.hold(f"GET /{remote.bucket}/{remote.prefix}/step_1/shard{shard}.bin")
        p = spawn_cli("restore", "--to", str(target), "--destination", remote.url, env=env)
        held.wait()
        p.send_signal(signal.SIGKILL)
        p.wait(10)
        held.release(forward=False)
        assert [x for x in target.iterdir() if not x.name.startswith(".")] == []
    r = cli("restore", "--to", str(target), "--destination", remote.url, env=remote.env())
    assert r.returncode == 0, r.stderr
    assert same_tree(watch / "step_1", target / "step_1")
