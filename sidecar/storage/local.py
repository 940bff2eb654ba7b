"""``file://`` destinations: a mounted folder (NFS, EFS, Filestore, Azure Files, Lustre...).

Every write goes to a ``.ckpt-sidecar-tmp-*`` name in the target's own folder, is fsynced,
then renamed into place (or hard-linked, for create-only writes, so an existing object is
never replaced), and the folder is fsynced: atomic and durable on POSIX and network file
systems. The store reports no checksum of its own, so ``head`` gives ``crc32c=None``.
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

from sidecar.atomic_write import fsync_folder
from sidecar.storage.base import (
    AlreadyExists,
    Backend,
    NotFound,
    ObjectInfo,
    PermanentError,
    Progress,
    StorageError,
    TransientError,
)
from sidecar.storage.checksum import Crc32c
from sidecar.storage.keys import check_key
from sidecar.storage.local_copy import WriteError, copy_with_crc, drop_cached
from sidecar.storage.source import open_source

__all__ = ["TMP_PREFIX", "LocalBackend"]

TMP_PREFIX = ".ckpt-sidecar-tmp-"
STALE_TMP_SECONDS = 60.0
_PERMANENT = {errno.EACCES, errno.EPERM, errno.EROFS, errno.ENOTDIR}


def _wrap(err: OSError, what: str) -> StorageError:
    if err.errno == errno.ENOENT:
        return NotFound(what)
    if err.errno in _PERMANENT:
        return PermanentError(
            f"{what}: {err.strerror}; check that the destination folder is mounted read-write "
            "and writable by this user"
        )
    if err.errno == errno.ENOSPC:
        return TransientError(f"{what}: destination is full (ENOSPC); free space on it")
    return TransientError(f"{what}: {err}")


#: What ``link(2)`` answers on a file system without hard links (FUSE mounts of object
#: stores, some SMB shares).
_NO_LINKS = {errno.EPERM, errno.ENOTSUP, errno.EOPNOTSUPP, errno.ENOSYS}


def _discard(path: Path) -> None:
    """Remove a temporary file of ours, best effort: a mount that refuses deletes (some FUSE
    mounts of object stores) must not turn the error being reported into another; what is
    left is swept at the next start."""
    with contextlib.suppress(OSError):
        path.unlink(missing_ok=True)


def _make_folders(folder: Path) -> None:
    """Create ``folder`` and the folders above it that are missing, each made durable in
    its parent (fsync), so a crash cannot keep a file whose folder's name was lost."""
    missing = []
    while not folder.is_dir():
        missing.append(folder)
        folder = folder.parent
    for made in reversed(missing):
        try:
            made.mkdir()
        except FileExistsError:
            continue  # another writer made it: its own fsync covers it
        fsync_folder(made.parent)


class LocalBackend(Backend):
    """A destination folder on a mounted file system."""

    scheme = "file"

    def __init__(self, root: Path) -> None:
        self.root = root.absolute()

    @property
    def url(self) -> str:
        return f"file://{self.root}"

    def _path(self, key: str) -> Path:
        return self.root / check_key(key)

    def _tmp_beside(self, target: Path) -> Path:
        try:
            _make_folders(target.parent)
        except OSError as e:
            raise _wrap(e, f"create folder {target.parent}") from e
        return target.parent / f"{TMP_PREFIX}{uuid.uuid4().hex}"

    def _info(self, key: str, path: Path, crc: str | None = None) -> ObjectInfo:
        st = path.stat()
        return ObjectInfo(key=key, size=st.st_size, crc32c=crc, mtime=st.st_mtime)

    def _publish(self, tmp: Path, target: Path, *, create_only: bool) -> None:
        try:
            if create_only:
                try:
                    os.link(tmp, target)
                except FileExistsError:
                    raise AlreadyExists(str(target)) from None
                except OSError as e:
                    if e.errno in _NO_LINKS:
                        raise PermanentError(
                            f"publish {target}: this file system makes no hard links "
                            f"({e.strerror}), and a manifest is written create-only by "
                            "linking it into place; use a mount that has them (NFS, EFS, "
                            "Filestore, Lustre, Azure Files over NFS) or the store's own "
                            "destination (s3://, gs://, az://) instead of a FUSE mount"
                        ) from e
                    raise
                finally:
                    _discard(tmp)
            else:
                os.replace(tmp, target)
            fsync_folder(target.parent)
        except OSError as e:
            _discard(tmp)
            raise _wrap(e, f"publish {target}") from e

    def put_file(self, key: str, path: Path, *, progress: Progress | None = None) -> ObjectInfo:
        """Copy ``path`` to a temporary name (in the kernel where it can, written back as it
        goes, bench/file_copy.md), fsync it, rename it into place, and drop its pages from the
        page cache. The CRC32C is of the bytes the copy holds."""
        target = self._path(key)
        tmp = self._tmp_beside(target)
        try:
            with open_source(path) as src:
                try:
                    dst = os.open(tmp, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o666)
                except OSError as e:
                    raise _wrap(e, f"write {tmp}") from e
                try:
                    size, crc = copy_with_crc(
                        src.fileno(), dst, progress=progress, write_behind=True
                    )
                    try:
                        os.fsync(dst)
                    except OSError as e:
                        raise _wrap(e, f"fsync {target}") from e
                    drop_cached(dst)
                except WriteError as e:
                    raise _wrap(e, f"write {target}") from e
                finally:
                    os.close(dst)
        except BaseException:
            _discard(tmp)
            raise
        self._publish(tmp, target, create_only=False)
        return ObjectInfo(key=key, size=size, crc32c=crc.b64(), mtime=time.time())

    def put_bytes(self, key: str, data: bytes, *, create_only: bool = False) -> ObjectInfo:
        target = self._path(key)
        tmp = self._tmp_beside(target)
        try:
            with open(tmp, "xb") as f:
                f.write(data)
                f.flush()
                os.fsync(f.fileno())
        except OSError as e:
            _discard(tmp)
            raise _wrap(e, f"write {target}") from e
        self._publish(tmp, target, create_only=create_only)
        crc = Crc32c()
        crc.update(data)
        return ObjectInfo(key=key, size=len(data), crc32c=crc.b64(), mtime=time.time())

    def get_file(self, key: str, path: Path, *, progress: Progress | None = None) -> ObjectInfo:
        """Copy ``key`` into ``path`` (in the kernel where it can); the CRC32C is of the bytes
        ``path`` holds. A failed read of the store is a :class:`StorageError`; a failed
        write of ``path`` stays an ``OSError``."""
        source = self._path(key)
        try:
            src = open(source, "rb")  # noqa: SIM115
        except OSError as e:
            raise _wrap(e, f"read {key}") from e
        with src:
            dst = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o666)
            try:
                size, crc = copy_with_crc(src.fileno(), dst, progress=progress)
            except WriteError:
                raise
            except OSError as e:
                raise _wrap(e, f"read {key}") from e
            finally:
                os.close(dst)
        return ObjectInfo(key=key, size=size, crc32c=crc.b64(), mtime=None)

    def get_bytes(self, key: str) -> bytes:
        try:
            return self._path(key).read_bytes()
        except OSError as e:
            raise _wrap(e, f"read {key}") from e

    def head(self, key: str) -> ObjectInfo:
        path = self._path(key)
        try:
            if not path.is_file():
                raise NotFound(key)
            return self._info(key, path)
        except OSError as e:
            raise _wrap(e, f"stat {key}") from e

    def list(self, prefix: str = "") -> Iterator[ObjectInfo]:
        # Walk only the folder that can hold the prefix, then filter by string prefix.
        base = self.root
        head, _, _ = prefix.rpartition("/")
        if head:
            base = self.root / head
        try:
            if not stat.S_ISDIR(os.stat(base).st_mode):
                return
        except (FileNotFoundError, NotADirectoryError):
            return
        except OSError as e:
            raise _wrap(e, f"list {base}") from e

        ours = self.root / ".ckpt-sidecar"

        def failed(e: OSError) -> None:
            # Our bookkeeping (the manifests) that cannot be read is an error, never "nothing
            # there": the orphan sweep would take every object for an orphan. Another folder
            # (a root-owned lost+found at a volume's root) is left out of the listing, as
            # before: objects not listed are never deleted. One deleted meanwhile is gone.
            if isinstance(e, FileNotFoundError):
                return
            where = Path(e.filename) if e.filename else base
            if where in (base, ours) or ours in where.parents:
                raise _wrap(e, f"list {where}") from e

        for dirpath, dirnames, filenames in os.walk(base, onerror=failed):
            dirnames.sort()
            for name in sorted(filenames):
                if name.startswith(TMP_PREFIX):
                    continue
                full = Path(dirpath) / name
                key = full.relative_to(self.root).as_posix()
                if not key.startswith(prefix):
                    continue
                try:
                    info = self._info(key, full)
                except FileNotFoundError:
                    continue
                except OSError as e:
                    raise _wrap(e, f"list {full}") from e
                yield info

    def delete(self, key: str) -> None:
        path = self._path(key)
        try:
            path.unlink(missing_ok=True)
        except OSError as e:
            raise _wrap(e, f"delete {key}") from e
        parent = path.parent
        while parent != self.root:
            try:
                parent.rmdir()
            except OSError:
                break
            parent = parent.parent

    def copy(self, src: str, dst: str) -> ObjectInfo:
        source = self._path(src)
        target = self._path(dst)
        if not source.is_file():
            raise NotFound(src)
        tmp = self._tmp_beside(target)
        try:
            with open(source, "rb") as f:
                dst_fd = os.open(tmp, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o666)
                try:
                    size, crc = copy_with_crc(f.fileno(), dst_fd)
                    os.fsync(dst_fd)
                finally:
                    os.close(dst_fd)
        except OSError as e:
            _discard(tmp)
            raise _wrap(e, f"copy {src} to {dst}") from e
        self._publish(tmp, target, create_only=False)
        # The CRC32C of the bytes the copy holds, as the stores that report one do: the
        # caller compares it with the checksum it expects (an object changed in place is
        # caught here, not at restore).
        return ObjectInfo(key=dst, size=size, crc32c=crc.b64(), mtime=time.time())

    def check(self) -> None:
        try:
            self.root.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise _wrap(e, f"create destination {self.root}") from e
        if not os.access(self.root, os.W_OK):
            raise PermanentError(f"destination {self.root} is not writable by this user")
        # Manifests are published by a hard link (create-only): a mount without them is
        # told at start, not at the first commit.
        probe = self.root / f"{TMP_PREFIX}{uuid.uuid4().hex}"
        try:
            with open(probe, "xb"):
                pass
            self._publish(probe, probe.with_name(probe.name + "-link"), create_only=True)
        except OSError as e:
            raise _wrap(e, f"write in destination {self.root}") from e
        finally:
            _discard(probe)
            _discard(probe.with_name(probe.name + "-link"))

    def cleanup_stale(self, older_than_seconds: float) -> int:
        """Remove ``.ckpt-sidecar-tmp-*`` files untouched for the age, or for a minute at most:
        a live writer touches its temporary file continuously, a killed one never again."""
        removed = 0
        cutoff = time.time() - min(older_than_seconds, STALE_TMP_SECONDS)
        if not self.root.is_dir():
            return 0
        for dirpath, _, filenames in os.walk(self.root):
            for name in filenames:
                if name.startswith(TMP_PREFIX):
                    p = Path(dirpath) / name
                    with contextlib.suppress(OSError):  # gone, or a mount refusing deletes
                        if p.stat().st_mtime < cutoff:
                            p.unlink()
                            removed += 1
        return removed
