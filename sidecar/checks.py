"""Checking a committed checkpoint's objects against the store, for ``verify`` and for
``restore`` before it downloads.

:func:`check_all` checks that every object of a manifest is there with the manifest's size
and, where the store reports one, CRC32C, up to :data:`VERIFY_CONCURRENCY` at once; one
listing of a folder checkpoint's keys stands in for a HEAD per object where it can (presence
and size are in every listing; the CRC32C where ``Backend.lists_crc32c``). A single file is
asked for: its name is the prefix of other keys. :func:`verify_manifest` adds a read-back
of the bytes with ``deep`` or where the store reports no CRC32C. Both raise
:class:`VerifyFailed` naming an object, or a :class:`StorageError`.
"""

from __future__ import annotations

import concurrent.futures
import os
import threading
import uuid
from pathlib import Path

from sidecar.fanout import all_results
from sidecar.manifest import Manifest, ManifestFile
from sidecar.storage.base import Backend, NotFound, ObjectInfo

__all__ = ["VERIFY_CONCURRENCY", "VerifyFailed", "check_all", "verify_manifest"]

#: objects checked at once (HEADs)
VERIFY_CONCURRENCY = 16


class VerifyFailed(Exception):
    """One object of a checkpoint is missing or differs; the message names it."""


def _check_object(
    backend: Backend, f: ManifestFile, listed: ObjectInfo | None, *, need_crc: bool
) -> ObjectInfo:
    """The store's info of ``f``'s object, checked against the manifest (size, and CRC32C
    where known): ``listed``, its entry in a listing, unless there is none or ``need_crc``
    and it has no CRC32C; else a HEAD. Raises :class:`VerifyFailed`."""
    info = listed
    if info is None or (need_crc and info.crc32c is None):
        try:
            info = backend.head(f.key)
        except NotFound:
            raise VerifyFailed(f"object {f.key} is missing") from None
    if info.size != f.size:
        raise VerifyFailed(f"object {f.key} has size {info.size}, manifest says {f.size}")
    if info.crc32c is not None and info.crc32c != f.crc32c:
        raise VerifyFailed(f"object {f.key} has CRC32C {info.crc32c}, manifest says {f.crc32c}")
    return info


def _read_crc(backend: Backend, f: ManifestFile, tmp_dir: Path) -> None:
    tmp = tmp_dir / f".verify-{uuid.uuid4().hex}"
    try:
        info = backend.get_file(f.key, tmp)
    except NotFound:
        raise VerifyFailed(f"object {f.key} is missing") from None
    finally:
        tmp.unlink(missing_ok=True)
    if info.size != f.size or info.crc32c != f.crc32c:
        raise VerifyFailed(
            f"object {f.key} read back as {info.size} bytes CRC32C {info.crc32c}, "
            f"manifest says {f.size} bytes CRC32C {f.crc32c}"
        )


def verify_manifest(
    backend: Backend,
    m: Manifest,
    *,
    deep: bool,
    tmp_dir: Path,
    concurrency: int = VERIFY_CONCURRENCY,
) -> None:
    """Check every object of ``m``: present, of the manifest's size and, where the store
    reports one, of its CRC32C (up to ``concurrency`` objects at once; where the store's
    listings carry CRC32Cs, ``Backend.lists_crc32c``, one listing of a folder checkpoint's
    keys stands in for a HEAD per object); then, one object at a time (each is written to
    ``tmp_dir`` and removed), read back with ``deep`` or where the store reports no CRC32C
    and its bytes' CRC32C compared. Raises :class:`VerifyFailed` naming an object that
    failed, or a :class:`StorageError`."""
    infos = check_all(backend, m, need_crc=True, concurrency=concurrency)
    for f, info in zip(m.files, infos, strict=True):
        if deep or info.crc32c is None:
            _read_crc(backend, f, tmp_dir)


def check_all(
    backend: Backend, m: Manifest, *, need_crc: bool, concurrency: int = VERIFY_CONCURRENCY
) -> list[ObjectInfo]:
    """:func:`_check_object` for every object of ``m``, up to ``concurrency`` at once, after
    one listing where it stands in for HEADs: always when the CRC32C is not needed
    (presence and size are in every listing), else where listings carry it. Returns the
    infos in the order of ``m.files``; raises the first :class:`VerifyFailed` (or other
    error) once every check started has ended."""
    listed = _listed(backend, m) if backend.lists_crc32c or not need_crc else {}
    stop = threading.Event()

    def check(f: ManifestFile) -> ObjectInfo | None:
        if stop.is_set():
            return None  # another object failed: its error is the one raised
        return _check_object(backend, f, listed.get(f.key), need_crc=need_crc)

    with concurrent.futures.ThreadPoolExecutor(concurrency, "verify") as pool:
        infos = all_results([pool.submit(check, f) for f in m.files], stop)
    return [i for i in infos if i is not None]  # all of them: none failed


def _listed(backend: Backend, m: Manifest) -> dict[str, ObjectInfo]:
    """The store's listing of ``m``'s objects, by key: of the folder its keys share (a
    folder checkpoint's ``name/``); none when they share no folder (a single file: one
    HEAD is cheaper than listing every key that starts with its name)."""
    keys = {f.key for f in m.files}
    shared = os.path.commonprefix(sorted(keys))  # noqa: RUF071 - a string prefix, as list takes
    folder = shared[: shared.rfind("/") + 1]
    if not folder:
        return {}
    return {info.key: info for info in backend.list(folder) if info.key in keys}
