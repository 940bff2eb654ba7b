"""Opening a file to upload: ``open_source(path)``.

The file is opened read-only, never through a symlink at its last name (``O_NOFOLLOW``:
``OSError`` ELOOP) and never blocking on a FIFO swapped in there (``O_NONBLOCK``, which
reads of a regular file ignore). Every backend's ``put_file`` and the whole-file checksum
open their source here, so a name beneath a pinned folder (:mod:`sidecar.upload.beneath`)
cannot be redirected by a link swapped in at the last moment.
"""

from __future__ import annotations

import io
import os
from pathlib import Path

__all__ = ["open_source"]

_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC


def open_source(path: Path) -> io.BufferedReader:
    """A buffered binary reader of ``path``; raises ``OSError``."""
    fd = os.open(path, _FLAGS)
    try:
        return open(fd, "rb")
    except BaseException:
        os.close(fd)
        raise
