"""Small files written in place atomically, in folders other processes can write to;
``fsync_path``, which makes a file's or a folder's content durable; and ``fsync_folder``,
which does so for a folder where its file system can.

``write_atomically(folder, name, data)`` leaves ``folder/name`` holding either its old
content or all of ``data``, fsynced, and the folder fsynced after the rename. The
temporary file has a fresh random name and is created exclusively (``O_EXCL`` never
follows a symlink), so a link planted in the folder cannot make the daemon write anywhere
else; the rename replaces a link at ``name`` itself, not its target. Raises ``OSError``;
the temporary file is removed on failure.
"""

from __future__ import annotations

import contextlib
import errno
import os
import secrets
from pathlib import Path

__all__ = ["fsync_folder", "fsync_path", "write_atomically"]

#: What ``fsync(2)`` of a folder answers where the file system cannot sync one (some FUSE
#: and SMB mounts).
_NO_FOLDER_SYNC = {errno.EINVAL, errno.ENOTSUP, errno.EOPNOTSUPP, errno.ENOSYS}


def write_atomically(folder: Path, name: str, data: bytes) -> None:
    tmp = folder / f".{name}.{secrets.token_hex(8)}.ckpt-sidecar-tmp"
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
    fd = os.open(tmp, flags, 0o666)  # the umask applies, as for open(): others may read it
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, folder / name)
        fsync_folder(folder)  # the rename itself
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def fsync_path(path: Path) -> None:
    """fsync the file or folder at ``path`` (a folder: the names in it). Raises ``OSError``."""
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def fsync_folder(folder: Path) -> None:
    """fsync ``folder`` (the names in it) where its file system can; where it cannot, a
    rename in it is as durable as that file system makes it. Raises ``OSError``."""
    try:
        fsync_path(folder)
    except OSError as e:
        if e.errno not in _NO_FOLDER_SYNC:
            raise
