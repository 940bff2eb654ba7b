"""What counts as not yet durable: the drain's outcome and ``unprotected_seconds``."""

from __future__ import annotations

from pathlib import Path

from sidecar.model import CheckpointReady, EntryKind, FileEntry, FileState
from sidecar.unprotected import Unprotected


def ready(name: str, step: int | None, completed: float, written: int = 0) -> CheckpointReady:
    files = (FileEntry(name, Path(name), FileState(1, written, 1)),)
    return CheckpointReady(name, EntryKind.CHECKPOINT, False, files, step, 1.7e9, completed)


def test_a_commit_clears_a_lower_step_handed_off_again_later() -> None:
    """step_200 failed, was handed off again after step_300 completed, and a drain then
    superseded it for step_300: once step_300 commits, nothing is missing (it was reported
    "missed", exit 4, with the newest checkpoint durable)."""
    p = Unprotected(clock=lambda: 1000.0)
    p.add(ready("step_300", 300, 900.0, written=20))
    p.add(ready("step_200", 200, 950.0, written=10))  # retried: handed off again, later
    p.committed(ready("step_300", 300, 900.0, written=20))
    assert p.names() == [] and p.seconds() == 0.0


def test_a_newer_snapshot_of_the_same_name_stays_until_its_own_commit() -> None:
    p = Unprotected(clock=lambda: 1000.0)
    old, new = ready("last.ckpt", None, 900.0), ready("last.ckpt", None, 990.0)
    p.add(new)  # written again while the old one uploaded
    p.committed(old)
    assert p.names() == ["last.ckpt"]
    p.committed(new)
    assert p.names() == []


def test_a_higher_step_is_not_cleared_by_a_lower_one() -> None:
    p = Unprotected(clock=lambda: 1000.0)
    p.add(ready("step_300", 300, 900.0))
    p.committed(ready("step_200", 200, 950.0))
    assert p.names() == ["step_300"]


def test_a_vanished_old_copy_does_not_take_the_new_one_with_it() -> None:
    """A folder saved again under its name while the old copy was committed: the old copy's
    commit meets a vanished file, and the new copy must stay not durable."""
    p = Unprotected(clock=lambda: 1000.0)
    old, new = ready("step_5", 5, 900.0), ready("step_5", 5, 990.0)
    p.add(new)
    p.vanished(old)
    assert p.names() == ["step_5"]
    p.vanished(new)
    assert p.names() == []


def test_content_written_after_the_commit_stays_not_durable() -> None:
    """Lightning saves ``last.ckpt`` again in the next epoch, ten minutes after the stepped
    file that now commits: a lower rank, but newer content, which nothing uploaded."""
    p = Unprotected(clock=lambda: 1000.0)
    p.add(ready("last.ckpt", None, 990.0, written=20))
    p.committed(ready("epoch=7-step=7000.ckpt", 7000, 300.0, written=10))
    assert p.names() == ["last.ckpt"]
