"""Opening a file of the watch folder without following a symlink on the way to it.

``open_beneath(root, path)`` walks from ``root`` to ``path`` one name at a time with
``O_NOFOLLOW``, so a symlink anywhere beneath the root (a folder swapped for a link after
it was scanned included) is refused instead of leading out of it; the root itself may be
reached through links (the operator chose it). The caller reads the file it got through
:func:`reopenable`, a name for that very file that a later swap of ``path`` cannot redirect.
"""

from __future__ import annotations

import errno
import os
import stat
from pathlib import Path

__all__ = ["NotBeneath", "open_beneath", "reopenable"]

# O_PATH: a handle, not an open file. It opens nothing (no FIFO can block it) and makes no
# inotify open/close events of its own, so the watcher's count of open handles stays as a
# plain read's; the reads go through reopenable(). A link at the end is opened as the link
# itself, which the S_ISREG check refuses.
_PATH = getattr(os, "O_PATH", os.O_RDONLY)
_DIR_FLAGS = _PATH | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_FILE_FLAGS = _PATH | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
_PROC_FD = Path("/proc/self/fd")


class NotBeneath(OSError):
    """``path`` is not a regular file reached from the root without a symlink."""


def open_beneath(root: Path, path: Path) -> int:
    """A descriptor (``O_PATH``: for :func:`reopenable` and ``fstat``, not for reading) of
    the regular file ``path``; the caller closes it.

    Raises :class:`NotBeneath` when a name on the way is a symlink or ``path`` is not under
    ``root`` or not a regular file, ``FileNotFoundError`` when it is gone, ``OSError`` else.
    """
    try:
        parts = path.relative_to(root).parts
    except ValueError:
        raise NotBeneath(errno.EXDEV, "not under the watch folder", str(path)) from None
    if not parts:
        raise NotBeneath(errno.EISDIR, "the watch folder itself", str(path))
    fd = os.open(root, _PATH | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        for i, name in enumerate(parts):
            last = i == len(parts) - 1
            inner = _open_at(fd, name, _FILE_FLAGS if last else _DIR_FLAGS, path)
            os.close(fd)
            fd = inner
        mode = os.fstat(fd).st_mode
        if stat.S_ISLNK(mode):
            raise NotBeneath(errno.ELOOP, "a symlink, not followed", str(path))
        if not stat.S_ISREG(mode):
            raise NotBeneath(errno.EINVAL, "not a regular file", str(path))
    except BaseException:
        os.close(fd)
        raise
    return fd


def _open_at(dir_fd: int, name: str, flags: int, path: Path) -> int:
    try:
        return os.open(name, flags, dir_fd=dir_fd)
    except OSError as e:
        if e.errno in (errno.ELOOP, errno.ENOTDIR):  # O_NOFOLLOW met a link
            raise NotBeneath(
                e.errno, f"a symlink on the way from the watch folder ({name})", str(path)
            ) from None
        raise


def reopenable(fd: int, path: Path) -> Path:
    """A path that opens the file behind ``fd`` itself (``/proc/self/fd/N``); ``path`` where
    there is no /proc (then only the check at open stands)."""
    return _PROC_FD / str(fd) if _PROC_FD.is_dir() else path
