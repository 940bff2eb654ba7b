"""The typed hand-offs between stages. Every type here is a frozen dataclass."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from pathlib import Path

__all__ = [
    "CheckpointReady",
    "EntryKind",
    "FileEntry",
    "FileState",
    "Notice",
]


@dataclass(frozen=True, order=True)
class FileState:
    """What ``lstat`` says of a file; equal states mean "not changed"."""

    size: int
    mtime_ns: int
    inode: int


@dataclass(frozen=True)
class FileEntry:
    """One local file of a checkpoint: ``rel`` is its ``/``-separated path inside the entry."""

    rel: str
    path: Path
    state: FileState


class EntryKind(enum.Enum):
    CHECKPOINT = "checkpoint"
    OTHER = "other"


@dataclass(frozen=True)
class CheckpointReady:
    """A complete checkpoint entry (or one other file) that the watcher hands to the queue.

    ``name`` is the top-level entry name in the watched root; ``files`` is every file of it
    with the state seen when completeness was decided. ``is_dir`` tells a directory entry
    from a single file. ``completed_at`` is wall-clock seconds; ``completed_mono`` monotonic.
    """

    name: str
    kind: EntryKind
    is_dir: bool
    files: tuple[FileEntry, ...]
    step: int | None
    completed_at: float
    completed_mono: float
    layout: str = "plain"

    @property
    def size(self) -> int:
        return sum(f.state.size for f in self.files)

    @property
    def written_ns(self) -> int:
        """When its newest file was last written (mtime, ns); 0 with no file."""
        return max((f.state.mtime_ns for f in self.files), default=0)

    def order(self) -> tuple[int, float]:
        """Newer sorts higher: the step (none = -1), then the completion time."""
        return (self.step if self.step is not None else -1, self.completed_mono)


@dataclass(frozen=True)
class Notice:
    """A termination notice (or an early warning, when ``drain`` is false).

    ``deadline_mono`` is the deadline in ``time.monotonic()`` terms, fixed when received;
    ``deadline`` and ``received_at`` are wall-clock seconds for the trainer's notice file.
    ``event_id`` de-duplicates: one notice is handled once.
    """

    source: str
    kind: str
    deadline: float
    received_at: float
    deadline_mono: float
    event_id: str
    drain: bool = True
    detail: dict[str, str] = field(default_factory=dict, compare=False, hash=False)
