"""Local state: (path, size, mtime_ns, inode) -> CRC32C, so a restart reads nothing again.

A cache only: losing or corrupting the file costs a re-read, never a wrong commit, because
an entry is used only when the file's current (size, mtime_ns, inode) equals the recorded one.
"""

from __future__ import annotations

import json
import os
import threading
from pathlib import Path

import structlog

from sidecar.atomic_write import write_atomically
from sidecar.model import FileState

__all__ = ["StateCache"]

log = structlog.get_logger("sidecar.state")
_FILE = "files.json"


class StateCache:
    """Thread-safe; ``save`` writes atomically (temp name, fsync, rename)."""

    def __init__(self, folder: Path | None) -> None:
        self.folder = folder
        self._lock = threading.Lock()
        self._data: dict[str, tuple[int, int, int, str]] = {}
        self._dirty = False
        if folder is not None:
            self._load()

    def _load(self) -> None:
        assert self.folder is not None
        try:
            raw = json.loads((self.folder / _FILE).read_text(encoding="utf-8"))
            if not isinstance(raw, dict):
                raise TypeError("not a JSON object")
            for path, v in raw.items():
                size, mtime, ino, crc = v
                self._data[path] = (int(size), int(mtime), int(ino), str(crc))
        except FileNotFoundError:
            pass
        except (OSError, ValueError, TypeError) as e:
            log.warning("state.unreadable", folder=str(self.folder), error=str(e))

    def get(self, path: Path, state: FileState) -> str | None:
        with self._lock:
            v = self._data.get(str(path))
        if v and v[:3] == (state.size, state.mtime_ns, state.inode):
            return v[3]
        return None

    def put(self, path: Path, state: FileState, crc32c: str) -> None:
        with self._lock:
            self._data[str(path)] = (state.size, state.mtime_ns, state.inode, crc32c)
            self._dirty = True

    def save(self) -> None:
        """Persist, dropping entries whose file is gone. Errors are logged, never raised."""
        if self.folder is None:
            return
        with self._lock:
            if not self._dirty:
                return
            self._data = {p: v for p, v in self._data.items() if os.path.lexists(p)}
            payload = json.dumps(self._data)
            self._dirty = False
        try:
            self.folder.mkdir(parents=True, exist_ok=True)
            write_atomically(self.folder, _FILE, payload.encode("utf-8"))
        except OSError as e:
            log.warning("state.save_failed", folder=str(self.folder), error=str(e))
