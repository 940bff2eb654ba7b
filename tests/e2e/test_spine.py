"""The spine end to end: the daemon as a subprocess, a writer that behaves like a trainer."""

from __future__ import annotations

import json
import os
import threading
import urllib.request
from pathlib import Path

import pytest

from tests.e2e.harness import (
    Daemon,
    assert_invariant,
    checkpoint_is,
    cli,
    manifests,
    same_tree,
    step_at_least,
    write_atomic,
)


def test_renamed_single_files_are_committed(dirs: tuple[Path, Path], daemons: list[Daemon]) -> None:
    watch, remote = dirs
    d = Daemon(watch, f"file://{remote}")
    daemons.append(d)
    d.wait_for("daemon.ready")
    payloads = {f"step_{i}.pt": os.urandom(200_000 + i) for i in (10, 20, 30)}
    for name, data in payloads.items():
        write_atomic(watch / name, data)
        d.wait_for("checkpoint.committed", where=checkpoint_is(name))
    found = {m.name: m for m in assert_invariant(remote)}
    assert set(found) == set(payloads)
    for name, data in payloads.items():
        assert (remote / name).read_bytes() == data
        assert found[name].step == int(name.split("_")[1].split(".")[0])
    assert not any(".tmp" in m.name for m in found.values())
    assert d.terminate() == 0


def test_torch_dcp_folder_waits_for_metadata(
    dirs: tuple[Path, Path], daemons: list[Daemon]
) -> None:
    watch, remote = dirs
    d = Daemon(watch, f"file://{remote}", env={"CKPT_SIDECAR_CHECKPOINT__LAYOUT": "torch-dcp"})
    daemons.append(d)
    d.wait_for("daemon.ready")
    entry = watch / "step_100"
    entry.mkdir()
    shards = {f"__{i}_0.distcp": os.urandom(300_000) for i in range(4)}
    for name, data in shards.items():
        (entry / name).write_bytes(data)
    # Shards are closed and the folder is quiet, but .metadata is not there: no commit.
    with pytest.raises(AssertionError):
        d.wait_for("checkpoint.ready", timeout=2.0)
    (entry / ".metadata").write_bytes(b"dcp metadata written last")
    d.wait_for("checkpoint.committed", where=lambda e: e["checkpoint"] == "step_100")
    (m,) = assert_invariant(remote)
    assert {f.path for f in m.files} == {*shards, ".metadata"}
    assert m.is_dir and m.layout == "torch-dcp" and m.step == 100
    assert d.terminate() == 0


@pytest.mark.parametrize("mode", ["inotify", "poll"])
def test_growing_file_is_not_committed_until_whole(
    dirs: tuple[Path, Path], daemons: list[Daemon], mode: str
) -> None:
    watch, remote = dirs
    d = Daemon(
        watch,
        f"file://{remote}",
        env={
            "CKPT_SIDECAR_WATCH__MODE": mode,
            "CKPT_SIDECAR_WATCH__POLL_INTERVAL_SECONDS": "0.2",
            "CKPT_SIDECAR_WATCH__SETTLE_SECONDS": "1.0",
        },
    )
    daemons.append(d)
    d.wait_for("daemon.ready")
    chunks = [os.urandom(100_000) for _ in range(12)]
    wrote_all = threading.Event()
    with open(watch / "model_5.pt", "wb") as f:  # no temporary name: written in place
        for chunk in chunks:
            f.write(chunk)
            f.flush()
            # a trainer that writes for several seconds; a ready event would end the wait
            with pytest.raises(AssertionError):
                d.wait_for("checkpoint.ready", timeout=0.3)
        wrote_all.set()
    ev = d.wait_for("checkpoint.committed", where=lambda e: e["checkpoint"] == "model_5.pt")
    assert ev["bytes"] == sum(len(c) for c in chunks)
    assert (remote / "model_5.pt").read_bytes() == b"".join(chunks)
    assert len(d.named("checkpoint.committed")) == 1
    assert d.terminate() == 0


def test_restore_is_byte_identical_and_falls_back(
    dirs: tuple[Path, Path], daemons: list[Daemon], tmp_path: Path
) -> None:
    watch, remote = dirs
    d = Daemon(watch, f"file://{remote}")
    daemons.append(d)
    d.wait_for("daemon.ready")
    for step in (1, 2):
        entry = watch / f"step_{step}"
        tmp = watch / f".step_{step}.partial"
        (tmp / "shards").mkdir(parents=True)
        (tmp / "model.bin").write_bytes(os.urandom(400_000))
        (tmp / "shards" / "opt state.bin").write_bytes(os.urandom(150_000))
        os.replace(tmp, entry)
        d.wait_for("checkpoint.committed", where=checkpoint_is(entry.name))
    assert d.terminate() == 0

    target = tmp_path / "restored"
    target.mkdir()
    r = cli("restore", "--to", str(target), "--destination", f"file://{remote}")
    assert r.returncode == 0, r.stderr
    assert same_tree(watch / "step_2", target / "step_2")
    assert not (target / "step_1").exists()
    assert [p.name for p in target.iterdir() if p.name.startswith(".ckpt-sidecar-restore")] == []

    # Corrupt one object of the newest checkpoint: restore names it and falls back.
    victim = remote / "step_2" / "model.bin"
    data = bytearray(victim.read_bytes())
    data[1000] ^= 0xFF
    victim.write_bytes(bytes(data))
    again = tmp_path / "again"
    r = cli("restore", "--to", str(again), "--destination", f"file://{remote}")
    assert r.returncode == 0, r.stderr
    assert "step_2/model.bin" in r.stderr
    assert same_tree(watch / "step_1", again / "step_1")
    assert not (again / "step_2").exists()

    # The same entry again: already there, nothing to do (a restart of the init container).
    r = cli("restore", "--to", str(again), "--destination", f"file://{remote}")
    assert r.returncode == 0, r.stderr
    # A different entry of that name: refused without --force, moved aside with it.
    (again / "step_1" / "model.bin").write_bytes(b"trainer changed it")
    r = cli("restore", "--to", str(again), "--destination", f"file://{remote}")
    assert r.returncode == 1 and "--force" in r.stderr
    r = cli("restore", "--to", str(again), "--destination", f"file://{remote}", "--force")
    assert r.returncode == 0, r.stderr
    assert any(p.name.startswith("step_1.replaced-") for p in again.iterdir())


def test_restore_fills_the_state_folder_the_daemon_uses(
    dirs: tuple[Path, Path], daemons: list[Daemon], tmp_path: Path
) -> None:
    """With ``state.dir`` set (the systemd units' StateDirectory), restore records the
    restored files' checksums there, where the daemon looks, not beside them."""
    watch, remote = dirs
    d = Daemon(watch, f"file://{remote}")
    daemons.append(d)
    d.wait_for("daemon.ready")
    write_atomic(watch / "step_3.pt", os.urandom(100_000))
    d.wait_for("checkpoint.committed", where=checkpoint_is("step_3.pt"))
    assert d.terminate() == 0
    target, state = tmp_path / "restored", tmp_path / "state"
    target.mkdir()
    r = cli(
        "restore",
        "--to",
        str(target),
        "--destination",
        f"file://{remote}",
        env={"CKPT_SIDECAR_STATE__DIR": str(state)},
    )
    assert r.returncode == 0, r.stderr
    assert str(target / "step_3.pt") in json.loads((state / "files.json").read_text())
    assert not (target / ".ckpt-sidecar-state").exists()


def test_restore_exit_codes_when_nothing_there(tmp_path: Path) -> None:
    empty = f"file://{tmp_path / 'remote'}"
    r = cli("restore", "--to", str(tmp_path / "t"), "--destination", empty)
    assert r.returncode == 3, r.stderr
    r = cli("restore", "--to", str(tmp_path / "t"), "--destination", empty, "--allow-empty")
    assert r.returncode == 0, r.stderr


def test_restore_when_none_verifies_exits_1(
    dirs: tuple[Path, Path], daemons: list[Daemon], tmp_path: Path
) -> None:
    watch, remote = dirs
    d = Daemon(watch, f"file://{remote}")
    daemons.append(d)
    d.wait_for("daemon.ready")
    write_atomic(watch / "only_1.pt", os.urandom(10_000))
    d.wait_for("checkpoint.committed")
    assert d.terminate() == 0
    (remote / "only_1.pt").write_bytes(b"truncated")
    r = cli("restore", "--to", str(tmp_path / "t"), "--destination", f"file://{remote}")
    assert r.returncode == 1
    assert "none verifies" in r.stderr and "only_1.pt" in r.stderr


def test_list_and_verify(dirs: tuple[Path, Path], daemons: list[Daemon]) -> None:
    watch, remote = dirs
    d = Daemon(watch, f"file://{remote}")
    daemons.append(d)
    d.wait_for("daemon.ready")
    write_atomic(watch / "a_1.pt", os.urandom(5000))
    d.wait_for("checkpoint.committed")
    port = d.admin_port
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/v1/status", timeout=5) as resp:
        status = json.load(resp)
    assert status["state"] == "running"
    assert status["last_committed"]["name"] == "a_1.pt"
    assert d.terminate() == 0
    r = cli("list", "--json", "--destination", f"file://{remote}")
    assert r.returncode == 0, r.stderr
    rows = json.loads(r.stdout)
    assert [(row["name"], row["step"], row["files"]) for row in rows] == [("a_1.pt", 1, 1)]
    assert cli("verify", "--all", "--deep", "--destination", f"file://{remote}").returncode == 0
    # A manifest that does not parse is a checkpoint that cannot be restored: said, not hidden.
    (remote / ".ckpt-sidecar/manifests/b_2.pt.json").write_text("{not json")
    r = cli("verify", "--all", "--destination", f"file://{remote}")
    assert r.returncode == 1 and "FAILED  manifest .ckpt-sidecar/manifests/b_2.pt.json" in r.stdout
    r = cli("list", "--json", "--destination", f"file://{remote}")
    assert r.returncode == 0 and [row["name"] for row in json.loads(r.stdout)] == ["a_1.pt"]
    assert "b_2.pt.json cannot be read as a manifest" in r.stderr
    (remote / "a_1.pt").write_bytes(b"x" * 5000)
    r = cli("verify", "a_1.pt", "--deep", "--destination", f"file://{remote}")
    assert r.returncode == 1 and "a_1.pt" in r.stdout


def test_restart_converges_without_reupload(dirs: tuple[Path, Path], daemons: list[Daemon]) -> None:
    """More committed checkpoints on disk than the queue holds (4): on restart each is found
    committed from the checksum cache; nothing is uploaded again or logged as superseded."""
    watch, remote = dirs
    N = 16
    d = Daemon(watch, f"file://{remote}", env={"CKPT_SIDECAR_RETENTION__KEEP_LAST": "40"})
    daemons.append(d)
    d.wait_for("daemon.ready")
    for i in range(1, N + 1):
        write_atomic(watch / f"s_{i}.pt", os.urandom(50_000))
        d.wait_for("checkpoint.committed", where=checkpoint_is(f"s_{i}.pt"))
    assert d.terminate() == 0
    mtimes = {p.name: p.stat().st_mtime_ns for p in remote.glob("s_*.pt")}
    write_atomic(watch / f"s_{N + 1}.pt", os.urandom(50_000))  # written while the daemon was down
    d2 = Daemon(watch, f"file://{remote}", env={"CKPT_SIDECAR_RETENTION__KEEP_LAST": "40"})
    daemons.append(d2)
    d2.wait_for("checkpoint.committed", where=checkpoint_is(f"s_{N + 1}.pt"))
    for i in range(1, N + 1):
        d2.wait_for("checkpoint.already_committed", where=checkpoint_is(f"s_{i}.pt"))
    assert not d2.named("checkpoint.superseded")
    assert {n: (remote / n).stat().st_mtime_ns for n in mtimes} == mtimes
    assert d2.terminate() == 0


def test_name_written_again_becomes_a_generation(
    dirs: tuple[Path, Path], daemons: list[Daemon], tmp_path: Path
) -> None:
    watch, remote = dirs
    d = Daemon(watch, f"file://{remote}")
    daemons.append(d)
    d.wait_for("daemon.ready")
    first, second = os.urandom(30_000), os.urandom(30_000)
    write_atomic(watch / "last.ckpt", first)
    d.wait_for("checkpoint.committed", where=lambda e: e["generation"] == 0)
    write_atomic(watch / "last.ckpt", second)
    d.wait_for("checkpoint.committed", where=lambda e: e["generation"] == 1)
    assert d.terminate() == 0
    assert (remote / "last.ckpt").read_bytes() == first  # never written over
    assert (remote / "last.ckpt@g1").read_bytes() == second
    assert_invariant(remote)
    r = cli("restore", "--to", str(tmp_path / "t"), "--destination", f"file://{remote}")
    assert r.returncode == 0, r.stderr
    assert (tmp_path / "t" / "last.ckpt").read_bytes() == second


@pytest.mark.slow
def test_sigkill_trials_converge(
    dirs: tuple[Path, Path], daemons: list[Daemon], tmp_path: Path
) -> None:
    """Ten SIGKILLs at random moments during uploads; each restart converges."""
    import random

    watch, remote = dirs
    rng = random.Random(1234)
    env = {
        "CKPT_SIDECAR_UPLOAD__MAX_BANDWIDTH_BYTES_PER_SECOND": str(20 * 1024 * 1024),
        "CKPT_SIDECAR_QUEUE__MAX_CHECKPOINTS": "100",
        "CKPT_SIDECAR_RETENTION__KEEP_LAST": "100",
    }
    step = 0
    for _trial in range(10):
        d = Daemon(watch, f"file://{remote}", env=env)
        daemons.append(d)
        d.wait_for("daemon.ready")
        for _ in range(2):
            step += 1
            entry = watch / f"step_{step}"
            tmp = watch / f"step_{step}.tmp"
            tmp.mkdir()
            for i in range(rng.randint(1, 4)):
                (tmp / f"part{i}.bin").write_bytes(os.urandom(rng.randint(1, 6) * 1024 * 1024))
            os.replace(tmp, entry)
        d.wait_for("checkpoint.ready", where=step_at_least(step - 1))
        threading.Event().wait(rng.uniform(0.0, 0.8))  # a random moment during the uploads
        d.kill()
        assert_invariant(remote)
    final = Daemon(watch, f"file://{remote}", env=env)
    daemons.append(final)
    final.wait_for("daemon.ready")
    want = {f"step_{s}" for s in range(1, step + 1)}
    committed_before = {m.name for m in manifests(remote)}
    for name in sorted(want - committed_before):
        final.wait_for("checkpoint.committed", timeout=60, where=checkpoint_is(name))
    found = {m.name: m for m in assert_invariant(remote)}
    assert set(found) == want
    for name in want:
        for f in found[name].files:
            assert (watch / name / f.path).read_bytes() == (remote / f.key).read_bytes()
    assert final.terminate() == 0
    target = tmp_path / "restored"
    r = cli("restore", "--to", str(target), "--destination", f"file://{remote}")
    assert r.returncode == 0, r.stderr
    assert same_tree(watch / f"step_{step}", target / f"step_{step}")
