"""Layout presets (DESIGN.md table), temporary names and step parsing."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sidecar.model import FileState
from sidecar.watch.layouts import is_temporary, layout_for, read_pointer, step_of

_S = FileState(size=1, mtime_ns=1, inode=1)


def snap(*names: str) -> dict[str, FileState]:
    return {n: _S for n in names}


@pytest.mark.parametrize(
    "name",
    [
        "model.pt.tmp",
        "model.pt.partial",
        "shard.dirty",
        "42.orbax-checkpoint-tmp-1700000000",
        "notes.txt~",
        "#notes#",
        ".#notes",
        ".model.pt.swp",
        "x.swx",
    ],
)
def test_temporary_names_are_recognised(name: str) -> None:
    assert is_temporary(name)


@pytest.mark.parametrize(
    "name", ["model.pt", "step_100", "checkpoint-5", "latest", "tmp", "global_step10", "a-tmp"]
)
def test_ordinary_names_are_not_temporary(name: str) -> None:
    assert not is_temporary(name)


@pytest.mark.parametrize(
    ("name", "step"),
    [
        ("global_step1200", 1200),
        ("checkpoint-500", 500),
        ("step_00042", 42),
        ("model.v2-step-300.ckpt", 300),
        ("epoch=3-step=900.ckpt", 900),
        ("last.ckpt", None),
        ("final", None),
    ],
)
def test_step_is_the_last_integer_of_the_name(name: str, step: int | None) -> None:
    assert step_of(name) == step


def test_step_regex_capture_wins_over_last_integer() -> None:
    assert step_of("epoch=3-step=900.ckpt", r"epoch=(\d+)") == 3
    assert step_of("no-number-here", r"step=(\d+)") is None


@given(
    st.text(st.characters(blacklist_characters="\n"), max_size=40),
    st.integers(min_value=0, max_value=10**12),
)
@settings(max_examples=200, deadline=None, database=None)
def test_step_of_a_name_ending_in_a_number_is_that_number(prefix: str, n: int) -> None:
    name = f"{prefix}_{n}"
    assert step_of(name) == n


def test_last_integer_is_found_across_a_newline_in_the_name() -> None:
    assert step_of("step_1\nstep_2") == 2


def test_step_regex_capturing_a_superscript_digit_gives_no_step() -> None:
    assert step_of("step²", r"step(\S+)") is None


# -- which names are checkpoints -----------------------------------------------------------
@pytest.mark.parametrize(
    ("layout", "name", "is_dir", "expected"),
    [
        ("plain", "model.pt", False, True),
        ("plain", "weights.safetensors", False, True),
        ("plain", "last.ckpt", False, True),
        ("plain", "train.log", False, False),
        ("plain", "step_10", True, True),
        ("plain", "global_step10", True, True),
        ("plain", "logs", True, False),
        ("plain", "model.pt", True, False),
        ("torch-dcp", "anything", True, True),
        ("torch-dcp", "file.pt", False, False),
        ("orbax", "1200", True, True),
        ("orbax", "metrics", True, False),
        ("deepspeed", "global_step7", True, True),
        ("deepspeed", "latest", False, False),
        ("hf-trainer", "checkpoint-500", True, True),
        ("hf-trainer", "runs", True, False),
        ("marker", "whatever", True, True),
    ],
)
def test_default_patterns_per_layout(layout: str, name: str, is_dir: bool, expected: bool) -> None:
    assert layout_for(layout, marker="DONE").matches(name, is_dir) is expected


def test_pattern_overrides_preset_names() -> None:
    lay = layout_for("plain", pattern=["run-*"])
    assert lay.matches("run-7", True)
    assert lay.matches("run-7", False)
    assert not lay.matches("step_7", True)


# -- when is an entry complete -------------------------------------------------------------
def test_torch_dcp_complete_only_with_metadata(tmp_path: Path) -> None:
    lay = layout_for("torch-dcp")
    assert not lay.complete("s1", True, snap("__0_0.distcp"), tmp_path)
    assert lay.complete("s1", True, snap("__0_0.distcp", ".metadata"), tmp_path)
    assert not lay.needs_settle


def test_hf_trainer_needs_trainer_state_and_settle(tmp_path: Path) -> None:
    lay = layout_for("hf-trainer")
    assert not lay.complete("checkpoint-5", True, snap("model.safetensors"), tmp_path)
    assert lay.complete(
        "checkpoint-5", True, snap("model.safetensors", "trainer_state.json"), tmp_path
    )
    assert lay.needs_settle


def test_marker_layout_waits_for_the_configured_file(tmp_path: Path) -> None:
    lay = layout_for("marker", marker="_SUCCESS")
    assert not lay.complete("run", True, snap("a.bin", ".complete"), tmp_path)
    assert lay.complete("run", True, snap("a.bin", "_SUCCESS"), tmp_path)


def test_deepspeed_complete_when_latest_names_the_folder(tmp_path: Path) -> None:
    lay = layout_for("deepspeed")
    s = snap("mp_rank_00_model_states.pt")
    assert not lay.complete("global_step20", True, s, tmp_path)
    (tmp_path / "latest").write_text("global_step10\n")
    assert not lay.complete("global_step20", True, s, tmp_path)
    (tmp_path / "latest").write_text("global_step20\n")
    assert lay.complete("global_step20", True, s, tmp_path)
    assert lay.pointer_file == "latest"


def test_orbax_integer_folder_is_complete(tmp_path: Path) -> None:
    lay = layout_for("orbax")
    assert lay.complete("1200", True, snap("_METADATA"), tmp_path)
    assert not lay.complete("1200abc", True, snap("_METADATA"), tmp_path)


@pytest.mark.parametrize("layout", ["plain", "torch-dcp", "hf-trainer", "marker"])
def test_folder_with_a_temporary_file_inside_is_never_complete(layout: str, tmp_path: Path) -> None:
    lay = layout_for(layout, marker=".complete")
    s = snap(".metadata", "trainer_state.json", ".complete", "sub/shard.bin.partial")
    assert not lay.complete("checkpoint-1", True, s, tmp_path)


def test_unknown_layout_is_refused() -> None:
    with pytest.raises(KeyError):
        layout_for("nemo")


def test_deepspeed_latest_pointer_is_read_only_from_a_small_regular_file(tmp_path: Path) -> None:
    """A FIFO must not block the watcher, a link is not followed, a huge file is not read."""
    ds = layout_for("deepspeed")
    snap = {"mp_rank_00_model_states.pt": FileState(1, 1, 1)}
    latest = tmp_path / "latest"
    latest.write_text("global_step5\n")
    assert ds.complete("global_step5", True, snap, tmp_path)
    latest.unlink()
    os.mkfifo(latest)
    assert read_pointer(latest) is None
    assert not ds.complete("global_step5", True, snap, tmp_path)
    latest.unlink()
    (tmp_path / "elsewhere").write_text("global_step5\n")
    latest.symlink_to(tmp_path / "elsewhere")
    assert read_pointer(latest) is None
    latest.unlink()
    latest.write_text("global_step5" + " " * 10_000)
    assert read_pointer(latest) is None
