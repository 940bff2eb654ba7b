"""Restore: bring back the newest committed checkpoint that verifies.

:func:`restore` first checks that every object is there with its size
(:func:`sidecar.checks.check_all`: one listing, or a HEAD for a single file), downloads into
``DIR/.ckpt-sidecar-restore-<id>/`` (same file system), checks every object's size and the
CRC32C of its bytes against the manifest, then renames the entry into place
(plus the layout's pointer file, e.g. DeepSpeed's ``latest``). A checkpoint that fails is
reported with the object that failed and the next older one is tried. Keys that would
escape ``DIR`` are refused by the manifest parser. Raises :class:`NothingToRestore`,
:class:`NoneVerifies` or :class:`TargetExists`.
"""

from __future__ import annotations

import concurrent.futures
import os
import shutil
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import structlog

from sidecar.atomic_write import fsync_folder, fsync_path, write_atomically
from sidecar.catalog import Catalog
from sidecar.checks import VerifyFailed, check_all
from sidecar.manifest import Manifest, ManifestError, ManifestFile, parse
from sidecar.model import FileState
from sidecar.state import StateCache
from sidecar.storage.base import Backend, NotFound, StorageError
from sidecar.storage.checksum import crc32c_of_file
from sidecar.storage.keys import safe_relative
from sidecar.watch.scan import state_of

__all__ = [
    "NoneVerifies",
    "NothingToRestore",
    "RestoreResult",
    "TargetExists",
    "restore",
]

log = structlog.get_logger("sidecar.restore")
WORK_PREFIX = ".ckpt-sidecar-restore-"


class NothingToRestore(Exception):
    """The destination holds no committed checkpoint (exit 3)."""


class NoneVerifies(Exception):
    """Manifests exist but none verifies (exit 1)."""


class TargetExists(Exception):
    """The entry exists in the target folder and ``--force`` was not given (exit 1)."""


@dataclass(frozen=True)
class RestoreResult:
    manifest: Manifest
    path: Path
    skipped: tuple[tuple[str, str], ...]  # (checkpoint, reason) tried before this one


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
    fsync_path(dest)  # on disk before it is named as restored (and cached as verified)
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
    check_all(backend, m, need_crc=False)  # a missing or cut object fails before any download
    with concurrent.futures.ThreadPoolExecutor(concurrency) as pool:
        futs = {f: pool.submit(_download, backend, f, targets[f], progress) for f in m.files}
        states = {f: fut.result() for f, fut in futs.items()}
    folders = {work}
    for t in targets.values():  # every folder from a file's up to the work folder, once
        folders.update(p for p in t.parents if p == work or work in p.parents)
    for folder in folders:
        fsync_folder(folder)
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
    if pointer:  # it fsyncs the folder after its own rename, and so the one before
        write_atomically(target, pointer, f"{m.name}\n".encode())
    else:
        fsync_folder(target)  # the renames themselves
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
