"""Layout presets: which top-level names are checkpoints and when each is complete.

The table is DESIGN.md's: ``plain``, ``torch-dcp``, ``orbax``, ``deepspeed``, ``hf-trainer``,
``marker``. A rule sees a stable snapshot of the entry; the tracker adds the stability part.
"""

from __future__ import annotations

import fnmatch
import os
import re
import stat
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

from sidecar.model import FileState

__all__ = [
    "MAX_NAME_BYTES",
    "SAVE_TEMP_GLOBS",
    "Layout",
    "is_temporary",
    "layout_for",
    "name_problem",
    "read_pointer",
    "step_of",
]

Snapshot = Mapping[str, FileState]
Rule = Callable[[str, bool, Snapshot, Path], bool]

#: names a save is written under before its rename into place (Orbax's ``*-tmp-*``, the HF
#: Trainer's ``tmp-checkpoint-<n>``)
SAVE_TEMP_GLOBS = ("*.tmp", "*.partial", "*.dirty", "*-tmp-*", "tmp-checkpoint-*")
_TEMP_GLOBS = (*SAVE_TEMP_GLOBS, "*~", "#*#", ".#*", "*.swp", "*.swx")  # and editors' files
_TEMP_NAME = re.compile("|".join(fnmatch.translate(g) for g in _TEMP_GLOBS))  # one match, not 9
_PLAIN_FILES = ("*.pt", "*.pth", "*.ckpt", "*.safetensors", "*.bin", "*.npz", "*.pkl")
_PLAIN_DIRS = ("step*", "checkpoint*", "ckpt*", "epoch*", "global_step*")
_LAST_INT = re.compile(r"(\d+)(?!.*\d)", re.DOTALL)


def is_temporary(name: str) -> bool:
    """True for names a writer uses while a file is incomplete (never uploaded as themselves)."""
    return _TEMP_NAME.match(name) is not None


MAX_NAME_BYTES = 200  # leaves room for "@g<N>" and ".json" within a 255-byte file name


def name_problem(name: str) -> str | None:
    """Why a file or entry name cannot be stored as an object key, or None when it can."""
    try:
        encoded = name.encode("utf-8")
    except UnicodeEncodeError:
        return "the name is not valid UTF-8; rename it"
    if len(encoded) > MAX_NAME_BYTES:
        return f"the name is longer than {MAX_NAME_BYTES} bytes; shorten it"
    if "\\" in name:
        return "the name contains a backslash; rename it"
    return None


def step_of(name: str, step_regex: str | None = None) -> int | None:
    """The step of an entry: the ``step_regex`` capture, else the last integer in the name."""
    m = re.search(step_regex, name) if step_regex else _LAST_INT.search(name)
    digits = m.group(1) if m else None
    return int(digits) if digits and digits.isdecimal() else None


@dataclass(frozen=True)
class Layout:
    """A preset: ``matches(name, is_dir)`` picks checkpoint entries, ``complete`` judges one."""

    name: str
    file_globs: tuple[str, ...]
    dir_globs: tuple[str, ...]
    rule: Rule
    needs_settle: bool = True
    pointer_file: str | None = None

    def matches(self, name: str, is_dir: bool) -> bool:
        globs = self.dir_globs if is_dir else self.file_globs
        return any(fnmatch.fnmatchcase(name, g) for g in globs)

    def complete(self, name: str, is_dir: bool, snapshot: Snapshot, root: Path) -> bool:
        if is_dir and any(is_temporary(rel.rsplit("/", 1)[-1]) for rel in snapshot):
            return False
        return self.rule(name, is_dir, snapshot, root)


def _always(name: str, is_dir: bool, snap: Snapshot, root: Path) -> bool:
    return True


def _has(file_name: str) -> Rule:
    def rule(name: str, is_dir: bool, snap: Snapshot, root: Path) -> bool:
        return is_dir and file_name in snap

    return rule


MAX_POINTER_BYTES = 4096


def read_pointer(path: Path) -> str | None:
    """The stripped text of a pointer file such as DeepSpeed's ``latest``; None when it is
    missing, unreadable, not UTF-8, over ``MAX_POINTER_BYTES``, or not a regular file (a
    symlink is not followed; a FIFO there cannot block the watcher)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return None
        data = os.read(fd, MAX_POINTER_BYTES + 1)
        if len(data) > MAX_POINTER_BYTES:
            return None
        return data.decode("utf-8").strip()
    except (OSError, UnicodeDecodeError):
        return None
    finally:
        os.close(fd)


def _deepspeed(name: str, is_dir: bool, snap: Snapshot, root: Path) -> bool:
    return is_dir and read_pointer(root / "latest") == name


def layout_for(name: str, pattern: list[str] | None = None, marker: str | None = None) -> Layout:
    """The preset called ``name``; ``pattern`` (globs for files and folders) overrides its names."""
    presets: dict[str, Layout] = {
        "plain": Layout("plain", _PLAIN_FILES, _PLAIN_DIRS, _always),
        "torch-dcp": Layout("torch-dcp", (), ("*",), _has(".metadata"), needs_settle=False),
        "orbax": Layout("orbax", (), ("[0-9]*",), _orbax),
        "deepspeed": Layout("deepspeed", (), ("global_step*",), _deepspeed, pointer_file="latest"),
        "hf-trainer": Layout("hf-trainer", (), ("checkpoint-*",), _has("trainer_state.json")),
        "marker": Layout("marker", (), ("*",), _has(marker or ".complete"), needs_settle=False),
    }
    layout = presets[name]
    if pattern:
        globs = tuple(pattern)
        layout = Layout(
            layout.name, globs, globs, layout.rule, layout.needs_settle, layout.pointer_file
        )
    return layout


def _orbax(name: str, is_dir: bool, snap: Snapshot, root: Path) -> bool:
    # Orbax renames "<step>.orbax-checkpoint-tmp-*" into place (tmp names never reach here) or,
    # on stores without rename, writes commit_success.txt; a settled integer folder is whole.
    return is_dir and name.isdigit()
