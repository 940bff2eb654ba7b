"""SIGKILL at random moments with retention deleting as it goes, and during restore."""

from __future__ import annotations

import os
import random
import signal
import threading
from pathlib import Path

import pytest

from tests.e2e.harness import (
    Daemon,
    assert_invariant,
    checkpoint_is,
    cli,
    manifests,
    same_tree,
    spawn_cli,
    step_at_least,
)


def _checkpoint(watch: Path, step: int, rng: random.Random) -> None:
    tmp = watch / f"step_{step}.partial"
    tmp.mkdir()
    for i in range(rng.randint(1, 3)):
        (tmp / f"part{i}.bin").write_bytes(os.urandom(rng.randint(64, 2048) * 1024))
    os.replace(tmp, watch / f"step_{step}")


@pytest.mark.slow
def test_kills_during_commits_and_retention_keep_every_manifest_true(
    dirs: tuple[Path, Path], daemons: list[Daemon], tmp_path: Path
) -> None:
    """Twenty kills while checkpoints commit and retention (keep 2) deletes older ones."""
    watch, remote = dirs
    rng = random.Random(20261202)
    env = {"CKPT_SIDECAR_RETENTION__KEEP_LAST": "2", "CKPT_SIDECAR_WATCH__SETTLE_SECONDS": "0.2"}
    step = 0
    for trial in range(20):
        d = Daemon(watch, f"file://{remote}", env=env)
        daemons.append(d)
        d.wait_for("daemon.ready")
        for _ in range(3):
            step += 1
            _checkpoint(watch, step, rng)
        d.wait_for("checkpoint.ready", where=step_at_least(step))
        threading.Event().wait(rng.uniform(0.0, 0.4))  # a random moment: commits, deletes
        d.kill()
        found = assert_invariant(remote)
        if found:  # any moment: a restore gets a checkpoint that verifies
            target = tmp_path / f"restore-{trial}"
            r = cli("restore", "--to", str(target), "--destination", f"file://{remote}")
            assert r.returncode == 0, r.stderr
            (entry,) = [p for p in target.iterdir() if not p.name.startswith(".")]
            m = next(m for m in found if m.name == entry.name)
            for f in m.files:
                assert (entry / f.path).read_bytes() == (remote / f.key).read_bytes()
    final = Daemon(watch, f"file://{remote}", env=env)
    daemons.append(final)
    final.wait_for("daemon.ready")
    newest = f"step_{step}"
    if newest not in {m.name for m in manifests(remote)}:
        final.wait_for("checkpoint.committed", timeout=60, where=checkpoint_is(newest))
    assert final.terminate() == 0
    found = assert_invariant(remote)
    assert newest in {m.name for m in found}  # converged to the newest complete checkpoint
    assert len(found) <= 3


def test_restore_killed_midway_then_run_again(
    dirs: tuple[Path, Path], daemons: list[Daemon], tmp_path: Path
) -> None:
    watch, remote = dirs
    d = Daemon(watch, f"file://{remote}")
    daemons.append(d)
    d.wait_for("daemon.ready")
    entry = watch / "step_1.partial"
    entry.mkdir()
    for i in range(8):
        (entry / f"shard{i}.bin").write_bytes(os.urandom(8 * 1024 * 1024))
    os.replace(entry, watch / "step_1")
    d.wait_for("checkpoint.committed")
    assert d.terminate() == 0
    target = tmp_path / "t"
    rng = random.Random(7)
    for _ in range(3):
        p = spawn_cli("restore", "--to", str(target), "--destination", f"file://{remote}")
        threading.Event().wait(rng.uniform(0.3, 0.9))  # a random moment of the download
        p.send_signal(signal.SIGKILL)
        p.wait(10)
        visible = (
            [x for x in target.iterdir() if not x.name.startswith(".")] if target.exists() else []
        )
        # Killed before the rename: nothing visible; after it: the whole entry.
        assert visible == [] or same_tree(watch / "step_1", target / "step_1")
    r = cli("restore", "--to", str(target), "--destination", f"file://{remote}")
    assert r.returncode == 0, r.stderr
    assert same_tree(watch / "step_1", target / "step_1")
