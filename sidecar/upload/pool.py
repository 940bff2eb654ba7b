"""The uploader pool: N workers, one file each, streaming, checksummed, re-stat after read.

Guarantees of :meth:`UploaderPool.upload_files`:

* each file is read once while uploading (CRC32C in the same pass), or copied server-side
  when its size and CRC32C equal the reference file of the previous commit;
* a file whose (size, mtime_ns, inode) differs before and after the read raises
  :class:`FileChanged`: that upload never counts;
* transient store errors are retried with backoff; the first failure cancels the other
  files of the set and is raised (``FileNotFoundError`` for a vanished file);
* otherwise one result per job is returned, in the order of the jobs.
"""

from __future__ import annotations

import concurrent.futures
import os
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import structlog

from sidecar.fanout import all_results
from sidecar.heap import give_back_free_memory, resident_bytes
from sidecar.manifest import ManifestFile
from sidecar.metrics import Metrics
from sidecar.model import FileEntry, FileState
from sidecar.state import StateCache
from sidecar.storage.base import Backend, Cancelled, ObjectInfo, StorageError
from sidecar.storage.checksum import crc32c_of_file
from sidecar.upload.bandwidth import BandwidthLimiter
from sidecar.upload.beneath import source_beneath, stat_beneath
from sidecar.upload.retry import Backoff, retry
from sidecar.upload.throughput import ThroughputMeter
from sidecar.watch.scan import state_of

__all__ = ["FileChanged", "FileJob", "UploadResult", "UploaderPool"]

log = structlog.get_logger("sidecar.upload")
PROGRESS_LOG_SECONDS = 10.0
#: Each time this many bytes went up (or failed), the uploader looks at its resident memory...
CHECK_MEMORY_EVERY_BYTES = 8 * 1024 * 1024
#: ... and above this it gives the allocator's free pages back, so that buffers of many sizes
#: do not add up (sidecar/heap.py). Not every time: pages given back fault in again when the
#: next buffers reuse them, which after every file cost 0.1-0.2 CPU-s/GB (bench/memory.md).
GIVE_BACK_ABOVE_BYTES = 128 * 1024 * 1024


class FileChanged(Exception):
    """The file changed while (or before) it was read; the upload does not count."""


@dataclass(frozen=True)
class FileJob:
    file: FileEntry
    key: str
    reference: ManifestFile | None = None


@dataclass(frozen=True)
class UploadResult:
    rel: str
    key: str
    size: int
    crc32c: str
    copied: bool


class UploaderPool:
    """Owns the worker threads; ``close`` waits for them."""

    def __init__(
        self,
        backend: Backend,
        cache: StateCache,
        metrics: Metrics,
        backoff: Backoff,
        limiter: BandwidthLimiter,
        concurrency: int,
        stop: threading.Event,
        *,
        root: Path | None = None,
    ) -> None:
        self.backend = backend
        self.root = root
        self.cache = cache
        self.metrics = metrics
        self.backoff = backoff
        self.limiter = limiter
        self.stop = stop
        self._executor = concurrent.futures.ThreadPoolExecutor(
            concurrency, thread_name_prefix="upload"
        )
        self.in_flight: dict[str, tuple[int, int]] = {}  # key -> (bytes sent, size)
        self.meter = ThroughputMeter()
        self._lock = threading.Lock()
        self._since_check = 0  # bytes; races between workers are harmless

    def close(self) -> None:
        self._executor.shutdown(wait=True, cancel_futures=True)

    def upload_files(self, jobs: Sequence[FileJob], cancel: threading.Event) -> list[UploadResult]:
        futures = [self._executor.submit(self._one, job, cancel) for job in jobs]
        return all_results(futures, cancel)  # one wake-up for the set (bench/commit_latency.md)

    def _progress(self, key: str, cancel: threading.Event) -> Callable[[int], None]:
        next_log = time.monotonic() + PROGRESS_LOG_SECONDS

        def progress(n: int) -> None:
            nonlocal next_log
            if cancel.is_set() or self.stop.is_set():
                raise Cancelled(key)
            self.limiter.consume(n)
            self.meter.add(n)
            with self._lock:
                sent, size = self.in_flight.get(key, (0, 0))
                self.in_flight[key] = (sent + n, size)
            self.metrics.in_flight_bytes.inc(n)
            if time.monotonic() >= next_log:  # long uploads: a line every 10 s at most
                next_log = time.monotonic() + PROGRESS_LOG_SECONDS
                log.info("upload.progress", key=key, sent=sent + n, size=size)

        return progress

    def _one(self, job: FileJob, cancel: threading.Event) -> UploadResult:
        if cancel.is_set():
            raise Cancelled(job.key)
        with source_beneath(self.root, job.file.path) as (source, fd):
            return self._read_and_send(job, cancel, source, fd)

    def _read_and_send(
        self, job: FileJob, cancel: threading.Event, source: Path, fd: int | None
    ) -> UploadResult:
        """Reads the file by ``source``, through its folder ``fd`` (reached beneath the root)
        when there is one, so a name swapped for a symlink meanwhile cannot redirect a read."""
        path = job.file.path
        before = state_of(os.lstat(path) if fd is None else stat_beneath(fd, path))
        if before != job.file.state:
            raise FileChanged(f"{path} changed after it was judged complete")
        copied = self._try_copy(job, before, source)
        if copied is not None:
            return copied
        with self._lock:
            self.in_flight[job.key] = (0, before.size)
        started = time.monotonic()
        try:
            info = retry(
                lambda: self.backend.put_file(
                    job.key, source, progress=self._progress(job.key, cancel)
                ),
                self.backoff,
                on_retry=lambda n, e, d: self.note_retry("put_file", job.key, n, e, d),
                wait=self.stop.wait,
            )
        except StorageError as e:
            if not isinstance(e, Cancelled):
                self.metrics.files_uploaded.labels(self.backend.scheme, "error").inc()
            raise
        finally:
            with self._lock:
                sent, _ = self.in_flight.pop(job.key, (0, 0))
            self.metrics.in_flight_bytes.dec(sent)
            self._give_back(before.size)
        after = state_of(os.lstat(path))  # the name still names that file, unchanged
        if after != before or info.size != before.size or info.crc32c is None:
            self.metrics.files_uploaded.labels(self.backend.scheme, "changed").inc()
            raise FileChanged(f"{path} changed while it was uploaded")
        self.metrics.upload_seconds.observe(time.monotonic() - started)
        self.metrics.bytes_uploaded.labels(self.backend.scheme, "ok").inc(info.size)
        self.metrics.files_uploaded.labels(self.backend.scheme, "ok").inc()
        self.cache.put(path, before, info.crc32c)
        log.debug("upload.done", key=job.key, size=info.size)
        return UploadResult(job.file.rel, job.key, info.size, info.crc32c, copied=False)

    def _give_back(self, size: int) -> None:
        self._since_check += size
        if self._since_check >= CHECK_MEMORY_EVERY_BYTES:
            self._since_check = 0
            rss = resident_bytes()
            if rss is not None and rss > GIVE_BACK_ABOVE_BYTES:
                give_back_free_memory()

    def checksum(self, path: Path) -> str:
        """The CRC32C of the watch folder's file ``path``, read as uploads read it (reached
        from the root without following a link). Raises ``OSError`` (:class:`NotBeneath`)."""
        with source_beneath(self.root, path) as (source, _):
            return crc32c_of_file(source)

    def _try_copy(self, job: FileJob, state: FileState, source: Path) -> UploadResult | None:
        ref = job.reference
        if ref is None or ref.size != state.size:
            return None
        crc = self.cache.get(job.file.path, state)
        if crc is None:
            crc = crc32c_of_file(source)
            if state_of(os.lstat(job.file.path)) != state:
                raise FileChanged(f"{job.file.path} changed while its checksum was read")
            self.cache.put(job.file.path, state, crc)
        if crc != ref.crc32c:
            return None
        try:
            info: ObjectInfo = retry(
                lambda: self.backend.copy(ref.key, job.key),
                self.backoff,
                on_retry=lambda n, e, d: self.note_retry("copy", job.key, n, e, d),
                wait=self.stop.wait,
            )
        except StorageError as e:
            log.info("upload.copy_fallback", key=job.key, source=ref.key, error=str(e))
            return None
        if info.size != ref.size or (info.crc32c is not None and info.crc32c != crc):
            log.warning("upload.copy_mismatch", key=job.key, source=ref.key)
            return None
        self.metrics.bytes_copied.inc(ref.size)
        self.metrics.files_uploaded.labels(self.backend.scheme, "copied").inc()
        log.debug("upload.copied", key=job.key, source=ref.key, size=ref.size)
        return UploadResult(job.file.rel, job.key, ref.size, crc, copied=True)

    def note_retry(self, op: str, key: str, attempt: int, err: Exception, delay: float) -> None:
        """Every retried store operation is counted (``retries{operation,kind}``) and logged
        (``upload.retry`` with the attempt number and the delay before the next one)."""
        kind = type(err).__name__
        self.metrics.retries.labels(op, kind).inc()
        log.warning(
            "upload.retry",
            operation=op,
            key=key,
            attempt=attempt,
            delay=round(delay, 2),
            error=str(err),
        )
