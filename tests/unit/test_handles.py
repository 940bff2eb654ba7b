"""OpenHandles: counts by path, following renames, never below zero."""

from __future__ import annotations

from pathlib import Path

from sidecar.watch.handles import OpenHandles

R = Path("/root")


def test_counts_follow_a_folder_rename_and_a_move_out_forgets_them() -> None:
    h = OpenHandles()
    h.opened(R / "step_1.tmp" / "a.bin")
    h.opened(R / "step_1.tmp" / "a.bin")
    h.opened(R / "step_1.tmp" / "b.bin")
    h.opened(R / "step_10" / "c.bin")  # a sibling whose name starts the same
    h.moved(R / "step_1.tmp", R / "step_1")
    assert h.count(R / "step_1") == 3
    assert h.count(R / "step_1.tmp") == 0
    h.closed(R / "step_1" / "a.bin")
    assert h.count(R / "step_1") == 2
    h.moved(R / "step_1", None)
    assert h.count(R / "step_1") == 0
    assert h.count(R / "step_10") == 1


def test_a_close_never_seen_opened_does_not_go_below_zero() -> None:
    h = OpenHandles()
    h.closed(R / "x.pt")  # its open was merged away by the kernel, or came before the watch
    h.opened(R / "x.pt")
    assert h.count(R / "x.pt") == 1


def test_forget_drops_a_folder_and_says_how_many_paths() -> None:
    h = OpenHandles()
    h.opened(R / "step_2" / "a.bin")
    h.opened(R / "step_2" / "b.bin")
    h.opened(R / "step_3" / "a.bin")
    assert h.forget(R / "step_2") == 2
    assert h.count(R / "step_2") == 0
    assert h.count(R / "step_3") == 1
