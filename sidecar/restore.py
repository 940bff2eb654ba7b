"""Restore, list and verify: bring back the newest committed checkpoint that verifies.

:func:`restore` downloads into ``DIR/.ckpt-sidecar-restore-<id>/`` (same file system), checks
every object's size and CRC32C against the manifest, then renames the entry into place
(plus the layout's pointer file, e.g. DeepSpeed's ``latest``). A checkpoint that fails is
reported with the object that failed and the next older one is tried. Keys that would
escape ``DIR`` are refused by the manifest parser. Raises :class:`NothingToRestore`,
:class:`NoneVerifies` or :class:`TargetExists`.
"""

from __future__ import annotations

import concurrent.futures
import os
import shutil
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import structlog

from sidecar.catalog import Catalog
from sidecar.fanout import all_results
from sidecar.manifest import Manifest, ManifestError, ManifestFile, parse
from sidecar.model import FileState
from sidecar.state import StateCache
from sidecar.storage.base import Backend, NotFound, ObjectInfo, StorageError
from sidecar.storage.checksum import crc32c_of_file
from sidecar.storage.keys import safe_relative
from sidecar.watch.scan import state_of

__all__ = [
    "NoneVerifies",
    "NothingToRestore",
    "RestoreResult",
    "TargetExists",
    "VerifyFailed",
    "restore",
    "verify_manifest",
]

log = structlog.get_logger("sidecar.restore")
WORK_PREFIX = ".ckpt-sidecar-restore-"
#: objects :func:`verify_manifest` checks at once (HEADs, or reads back)
VERIFY_CONCURRENCY = 16


class NothingToRestore(Exception):
    """The destination holds no committed checkpoint (exit 3)."""


class NoneVerifies(Exception):
    """Manifests exist but none verifies (exit 1)."""


class TargetExists(Exception):
    """The entry exists in the target folder and ``--force`` was not given (exit 1)."""


class VerifyFailed(Exception):
    """One object of a checkpoint is missing or differs; the message names it."""


@dataclass(frozen=True)
class RestoreResult:
    manifest: Manifest
    path: Path
    skipped: tuple[tuple[str, str], ...]  # (checkpoint, reason) tried before this one


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
    infos = _check_all(backend, m, need_crc=True, concurrency=concurrency)
    for f, info in zip(m.files, infos, strict=True):
        if deep or info.crc32c is None:
            _read_crc(backend, f, tmp_dir)


def _check_all(
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


def _download(
    backend: Backend, f: ManifestFile, dest: Path, progress: Callable[[int], None] | None
) -> FileState:
    dest.parent.mkdir(parents=True, exist_ok=True)
    try:
        info = backend.get_file(f.key, dest, progress=progress)
    except NotFound:
        raise VerifyFailed(f"object {f.key} is missing") from None
    if info.size != f.size or info.crc32c != f.crc32c:
        raise VerifyFailed(
            f"object {f.key} is {info.size} bytes with CRC32C {info.crc32c}; "
            f"manifest says {f.size} bytes with CRC32C {f.crc32c}"
        )
    return state_of(os.lstat(dest))


def _fetch(
    backend: Backend,
    m: Manifest,
    work: Path,
    concurrency: int,
    progress: Callable[[int], None] | None,
) -> dict[Path, tuple[FileState, str]]:
    entry = work / m.name
    if m.is_dir:
        entry.mkdir(parents=True)
    targets = {f: (entry / safe_relative(f.path) if m.is_dir else entry) for f in m.files}
    _check_all(backend, m, need_crc=False)  # a missing or cut object fails before any download
    with concurrent.futures.ThreadPoolExecutor(concurrency) as pool:
        futs = {f: pool.submit(_download, backend, f, targets[f], progress) for f in m.files}
        states = {f: fut.result() for f, fut in futs.items()}
    return {targets[f]: (states[f], f.crc32c) for f in m.files}


def _candidates(backend: Backend, name: str | None) -> list[Manifest]:
    bad: list[str] = []

    def invalid(key: str, reason: str) -> None:
        log.warning("restore.manifest_invalid", manifest=key, reason=reason)
        bad.append(f"{key}: {reason}")

    items = Catalog.load(backend, on_invalid=invalid).all()
    if not items and bad:
        raise NoneVerifies("manifests exist but none verifies: " + "; ".join(bad))
    if name is not None:
        items = sorted((m for m in items if m.name == name), key=lambda m: -m.generation)
    return items


def _place(m: Manifest, work: Path, target: Path, force: bool, pointer: str | None) -> Path:
    final = target / m.name
    if os.path.lexists(final):
        if not force:
            raise TargetExists(
                f"{final} already exists; remove it or pass --force (it is then moved aside)"
            )
        stamp = time.strftime("%Y%m%dT%H%M%S")
        aside = target / f"{m.name}.replaced-{stamp}"
        n = 1
        while os.path.lexists(aside):  # never overwrite an earlier moved-aside copy
            n += 1
            aside = target / f"{m.name}.replaced-{stamp}-{n}"
        os.replace(final, aside)
        log.info("restore.moved_aside", path=str(final), to=str(aside))
    os.replace(work / m.name, final)
    if pointer:
        tmp = target / f".{pointer}.ckpt-sidecar-tmp"
        tmp.write_text(m.name + "\n", encoding="utf-8")
        os.replace(tmp, target / pointer)
    return final


_POINTERS = {"deepspeed": "latest"}


def restore(
    backend: Backend,
    target: Path,
    *,
    name: str | None = None,
    force: bool = False,
    concurrency: int = 8,
    cache: StateCache | None = None,
    progress: Callable[[int], None] | None = None,
    on_start: Callable[[Manifest], None] | None = None,
) -> RestoreResult:
    """Restore the newest (or the named) checkpoint that verifies into ``target``."""
    target.mkdir(parents=True, exist_ok=True)
    _sweep_abandoned(target)
    candidates = _candidates(backend, name)
    if not candidates:
        raise NothingToRestore(
            f"no committed checkpoint{' named ' + repr(name) if name else ''} in {backend.url}"
        )
    skipped: list[tuple[str, str]] = []
    relisted = False
    i = 0
    while i < len(candidates):
        m = candidates[i]
        if not force and os.path.lexists(target / m.name):
            if _already_present(m, target / m.name, cache):
                log.info("restore.already_present", checkpoint=m.name, path=str(target / m.name))
                return RestoreResult(m, target / m.name, tuple(skipped))
            raise TargetExists(
                f"{target / m.name} already exists; remove it or pass --force "
                "(it is then moved aside)"
            )
        work = target / f"{WORK_PREFIX}{uuid.uuid4().hex[:12]}"
        work.mkdir()
        try:
            if on_start:
                on_start(m)
            fetched = _fetch(backend, m, work, concurrency, progress)
            final = _place(m, work, target, force, _POINTERS.get(m.layout))
        except VerifyFailed as e:
            if "missing" in str(e) and not relisted:
                relisted = True  # retention may have replaced it meanwhile: list once more
                fresh = _still_committed(backend, m)
                if fresh is None:
                    candidates = _candidates(backend, name)
                    i = 0
                    continue
            log.warning(
                "restore.fallback", checkpoint=m.name, generation=m.generation, reason=str(e)
            )
            skipped.append((m.name, str(e)))
            i += 1
            continue
        except (StorageError, OSError) as e:
            log.warning("restore.fallback", checkpoint=m.name, reason=str(e))
            skipped.append((m.name, str(e)))
            i += 1
            continue
        finally:
            shutil.rmtree(work, ignore_errors=True)
        if cache is not None:
            for path, (state, crc) in fetched.items():
                cache.put(
                    final / path.relative_to(work / m.name) if m.is_dir else final, state, crc
                )
            cache.save()
        log.info(
            "restore.done",
            checkpoint=m.name,
            generation=m.generation,
            step=m.step,
            files=len(m.files),
            bytes=m.size,
            path=str(final),
        )
        return RestoreResult(m, final, tuple(skipped))
    raise NoneVerifies(
        "manifests exist but none verifies: " + "; ".join(f"{n}: {r}" for n, r in skipped)
    )


def _sweep_abandoned(target: Path, older_than: float = 60.0) -> None:
    """Remove work folders of restores that were killed (untouched for ``older_than`` s)."""
    cutoff = time.time() - older_than
    for work in target.glob(f"{WORK_PREFIX}*"):
        try:
            if work.is_dir() and work.stat().st_mtime < cutoff:
                shutil.rmtree(work, ignore_errors=True)
                log.info("restore.abandoned_work_removed", path=str(work))
        except OSError:
            continue


def _already_present(m: Manifest, entry: Path, cache: StateCache | None) -> bool:
    """Does ``entry`` hold exactly the manifest's files with their sizes and CRC32C?"""
    if m.is_dir != entry.is_dir() or entry.is_symlink():
        return False
    local = (
        {p.relative_to(entry).as_posix(): p for p in entry.rglob("*") if p.is_file()}
        if m.is_dir
        else {m.name: entry}
    )
    if set(local) != {f.path for f in m.files}:
        return False
    for f in m.files:
        p = local[f.path]
        st = state_of(os.lstat(p))
        if st.size != f.size:
            return False
        crc = cache.get(p, st) if cache is not None else None
        if (crc or crc32c_of_file(p)) != f.crc32c:
            return False
    return True


def _still_committed(backend: Backend, m: Manifest) -> Manifest | None:
    try:
        return parse(backend.get_bytes(m.key), where=m.key)
    except (NotFound, ManifestError):
        return None
