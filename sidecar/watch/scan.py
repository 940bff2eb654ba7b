"""Snapshots of entries: ``lstat`` of every regular file, symlinks never followed."""

from __future__ import annotations

import os
import stat
from collections.abc import Callable
from pathlib import Path

from sidecar.model import FileState

__all__ = ["Snapshot", "scan_entry", "state_of"]

Snapshot = dict[str, FileState]


def state_of(st: os.stat_result) -> FileState:
    return FileState(size=st.st_size, mtime_ns=st.st_mtime_ns, inode=st.st_ino)


def scan_entry(path: Path, on_symlink: Callable[[Path], None] | None = None) -> Snapshot | None:
    """Every regular file under ``path`` (or ``path`` itself) keyed by ``/``-relative path.

    Returns ``None`` when ``path`` is gone. Symlinks are reported to ``on_symlink`` and
    skipped: nothing outside the watched root is ever read through one.
    """
    try:
        st = path.lstat()
    except FileNotFoundError:
        return None
    if stat.S_ISLNK(st.st_mode):
        if on_symlink:
            on_symlink(path)
        return None
    if stat.S_ISREG(st.st_mode):
        return {path.name: state_of(st)}
    if not stat.S_ISDIR(st.st_mode):
        return None
    out: Snapshot = {}
    stack = [(path, "")]
    while stack:
        folder, prefix = stack.pop()
        try:
            it = os.scandir(folder)
        except (FileNotFoundError, NotADirectoryError):
            continue
        with it:
            for de in it:
                rel = f"{prefix}{de.name}"
                try:
                    if de.is_symlink():
                        if on_symlink:
                            on_symlink(Path(de.path))
                        continue
                    if de.is_dir(follow_symlinks=False):
                        stack.append((Path(de.path), rel + "/"))
                    elif de.is_file(follow_symlinks=False):
                        out[rel] = state_of(de.stat(follow_symlinks=False))
                except FileNotFoundError:
                    continue
    return out
