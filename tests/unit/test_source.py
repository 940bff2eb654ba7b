"""Backends open the file to upload with ``open_source``: a regular file only, never
through a link at its name, never blocking on a FIFO, and with ordinary blocking reads."""

from __future__ import annotations

import errno
import fcntl
import os
from pathlib import Path

import pytest

from sidecar.storage.source import open_source


def test_a_regular_file_is_read_with_blocking_reads(tmp_path: Path) -> None:
    (tmp_path / "w.pt").write_bytes(b"weights")
    with open_source(tmp_path / "w.pt") as f:
        assert not fcntl.fcntl(f.fileno(), fcntl.F_GETFL) & os.O_NONBLOCK
        assert f.read() == b"weights"


def test_a_link_at_the_name_is_refused(tmp_path: Path) -> None:
    (tmp_path / "secret").write_bytes(b"secret")
    (tmp_path / "w.pt").symlink_to(tmp_path / "secret")
    with pytest.raises(OSError) as e:
        open_source(tmp_path / "w.pt")
    assert e.value.errno == errno.ELOOP


@pytest.mark.parametrize("kind", ["fifo", "device"])
def test_a_fifo_or_a_device_is_refused_without_blocking(tmp_path: Path, kind: str) -> None:
    path = tmp_path / "w.pt"
    if kind == "fifo":
        os.mkfifo(path)
    else:
        path = Path("/dev/zero")  # what a folder swapped for a link to /dev would offer
    with pytest.raises(OSError) as e:
        open_source(path)
    assert e.value.errno == errno.EINVAL
