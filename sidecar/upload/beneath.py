"""Reaching a file of the watch folder without following a symlink on the way to it.

``open_beneath(root, path)`` walks from ``root`` to the folder holding ``path`` one name at a
time with ``O_NOFOLLOW``, so a symlink anywhere beneath the root (a folder swapped for a link
after it was scanned included) is refused instead of leading out of it; the root itself may
be reached through links (the operator chose it). It returns a handle on that folder
(``O_PATH``: it opens nothing, so it makes no open/close event the watcher would count; the
watcher ignores folders' events anyway). :func:`reopenable` names the file inside that very
folder (``/proc/self/fd/N/<name>``), which a later swap of a folder cannot redirect, and
:func:`~sidecar.storage.source.open_source`, which every backend reads with, refuses a link at
the last name. So the bytes uploaded are those of a regular file beneath the root, read
with one ordinary open per read, as without this module.
"""

from __future__ import annotations

import contextlib
import errno
import functools
import os
import stat
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TypeVar

__all__ = ["NotBeneath", "open_beneath", "reopenable", "source_beneath", "stat_beneath"]

_PATH = getattr(os, "O_PATH", os.O_RDONLY)
_DIR_FLAGS = _PATH | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_PROC_FD = Path("/proc/self/fd")
T = TypeVar("T")


class NotBeneath(OSError):
    """``path`` is not a regular file reached from the root without a symlink."""


def open_beneath(root: Path, path: Path) -> int:
    """A handle on the folder holding ``path``, once ``path`` is found there as a regular
    file; the caller closes it. Raises :class:`NotBeneath` when a name on the way (``path``'s
    own included) is a symlink, or ``path`` is not under ``root`` or not a regular file;
    ``FileNotFoundError`` when it is gone; ``OSError`` else. Errors name ``path`` whole."""
    try:
        parts = path.relative_to(root).parts
    except ValueError:
        raise NotBeneath(errno.EXDEV, "not under the watch folder", str(path)) from None
    if not parts:
        raise NotBeneath(errno.EISDIR, "the watch folder itself", str(path))
    fd = _named(path, lambda: os.open(root, _PATH | os.O_DIRECTORY | os.O_CLOEXEC))
    try:
        for name in parts[:-1]:
            inner = _named(path, functools.partial(os.open, name, _DIR_FLAGS, dir_fd=fd), name)
            os.close(fd)
            fd = inner
        stat_beneath(fd, path)
    except BaseException:
        os.close(fd)
        raise
    return fd


def stat_beneath(folder_fd: int, path: Path) -> os.stat_result:
    """``lstat`` of ``path``'s name in the folder ``open_beneath`` returned; raises as it."""
    st = _named(path, lambda: os.stat(path.name, dir_fd=folder_fd, follow_symlinks=False))
    if stat.S_ISLNK(st.st_mode):
        raise NotBeneath(errno.ELOOP, "a symlink, not followed", str(path))
    if not stat.S_ISREG(st.st_mode):
        raise NotBeneath(errno.EINVAL, "not a regular file", str(path))
    return st


def _named(path: Path, call: Callable[[], T], name: str | None = None) -> T:
    """``call()``; its ``OSError`` naming ``path`` whole (not the one name it met), and a
    link met at folder ``name`` on the way as :class:`NotBeneath`."""
    try:
        return call()
    except OSError as e:
        if name is not None and e.errno in (errno.ELOOP, errno.ENOTDIR):  # O_NOFOLLOW met a link
            raise NotBeneath(
                e.errno, f"a symlink on the way from the watch folder ({name})", str(path)
            ) from None
        raise type(e)(e.errno, e.strerror, str(path)) from None


def reopenable(folder_fd: int, path: Path) -> Path:
    """A path to ``path``'s name inside the folder behind ``folder_fd``; ``path`` itself
    where there is no /proc (then only the checks at :func:`open_beneath` stand)."""
    return _PROC_FD / str(folder_fd) / path.name if _PROC_FD.is_dir() else path


@contextlib.contextmanager
def source_beneath(root: Path | None, path: Path) -> Iterator[tuple[Path, int | None]]:
    """For the block: the path to read ``path`` by (its folder reached from ``root`` one name
    at a time, no link followed; ``path`` itself without a root) and that folder's
    descriptor (None without a root). An ``OSError`` of the block that names the path read
    by names ``path`` instead: the operator needs the file's own name. Raises ``OSError``
    (:class:`NotBeneath`)."""
    fd = None if root is None else open_beneath(root, path)
    source = path if fd is None else reopenable(fd, path)
    try:
        yield source, fd
    except OSError as e:
        if source != path and e.filename == str(source):
            e.filename = str(path)
        raise
    finally:
        if fd is not None:
            os.close(fd)
