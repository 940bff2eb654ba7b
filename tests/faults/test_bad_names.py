"""Bad names and links in the watched folder: skipped and logged once; the daemon goes on."""

from __future__ import annotations

import os
from pathlib import Path

from tests.e2e.harness import Daemon, assert_invariant, checkpoint_is, write_atomic


def test_bad_names_and_links_never_stop_the_daemon(
    dirs: tuple[Path, Path],
    daemons: list[Daemon],
    tmp_path: Path,
) -> None:
    watch, remote = dirs
    outside = tmp_path / "secret.pt"
    outside.write_bytes(b"outside the root")
    os.symlink(outside, watch / "link_1.pt")  # a symlink out of the root
    os.symlink(watch / "loop_b", watch / "loop_a")  # a symlink loop
    os.symlink(watch / "loop_a", watch / "loop_b")
    (watch / "newline\nname_2.pt").write_bytes(b"a newline in the name")
    os.close(os.open(os.fsencode(watch) + b"/bad_\xff_3.pt", os.O_CREAT | os.O_WRONLY, 0o644))
    (watch / ("long_" + "x" * 240 + ".pt")).write_bytes(b"a very long name")
    d = Daemon(watch, f"file://{remote}")
    daemons.append(d)
    d.wait_for("daemon.ready")
    write_atomic(watch / "step_5.pt", os.urandom(10_000))
    d.wait_for("checkpoint.committed", where=checkpoint_is("step_5.pt"))
    d.wait_for("checkpoint.committed", where=checkpoint_is("newline\nname_2.pt"))
    skipped = d.named("watch.name_skipped")
    reasons = " ".join(e["reason"] for e in skipped)
    assert "not valid UTF-8" in reasons and "longer than 200 bytes" in reasons
    links = d.named("watch.symlink_skipped")
    assert any("link_1.pt" in e["path"] for e in links)
    touched = {e["path"] for e in links}
    assert len(touched) == len(links), "each link is logged once"
    names = {m.name for m in assert_invariant(remote)}
    assert names == {"step_5.pt", "newline\nname_2.pt"}
    assert not (remote / "link_1.pt").exists()
    assert d.proc.poll() is None
    assert d.terminate() == 0
