"""Opening a file to upload: ``open_source(path)``.

The file is opened read-only, never through a symlink at its last name (``O_NOFOLLOW``:
``OSError`` ELOOP), without blocking on a FIFO swapped in there (opened ``O_NONBLOCK``,
then refused as not a regular file, as a device is; reads block as usual). Every backend's
``put_file`` and the whole-file checksum open their source here, so a name beneath a
pinned folder (:mod:`sidecar.upload.beneath`) cannot be redirected by a link swapped in at
the last moment.
"""

from __future__ import annotations

import errno
import fcntl
import io
import os
import stat
from pathlib import Path

__all__ = ["open_source"]

_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC


def open_source(path: Path) -> io.BufferedReader:
    """A buffered binary reader of the regular file ``path`` (blocking reads); raises
    ``OSError`` (EINVAL for anything but a regular file)."""
    fd = os.open(path, _FLAGS)
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):  # a device or FIFO swapped in: refused
            raise OSError(errno.EINVAL, "not a regular file", str(path))
        fcntl.fcntl(fd, fcntl.F_SETFL, fcntl.fcntl(fd, fcntl.F_GETFL) & ~os.O_NONBLOCK)
        return open(fd, "rb")
    except BaseException:
        os.close(fd)
        raise
