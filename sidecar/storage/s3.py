"""``s3://bucket/prefix`` destinations: AWS S3 and S3-compatible stores (MinIO, Ceph RGW,
SeaweedFS, R2).

Keys are relative to the URL's prefix (``s3://b/run1`` + ``ckpt/a.pt`` -> ``run1/ckpt/a.pt``).
Every write carries a CRC32C computed in the same pass as the read and verified by the
store; multipart uploads complete with the whole-object (FULL_OBJECT) CRC32C, so ``head``
reports the whole-object CRC32C for every object we wrote (``None`` for objects written by
others with a COMPOSITE checksum or none). Create-only writes use ``If-None-Match: *``.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING, Any

import structlog

from sidecar.storage.base import (
    Backend,
    ChecksumMismatch,
    NotFound,
    ObjectInfo,
    Progress,
    TransientError,
)
from sidecar.storage.budget import Budget
from sidecar.storage.buffers import PartBuffers, read_into
from sidecar.storage.checksum import Crc32c
from sidecar.storage.keys import check_key
from sidecar.storage.options import S3Options
from sidecar.storage.s3_admin import abort_stale_uploads, check_destination
from sidecar.storage.s3_client import (
    full_crc,
    make_client,
    store_time,
    write_args,
)
from sidecar.storage.s3_download import Source, download
from sidecar.storage.s3_errors import StoreRejectedChecksum, map_error
from sidecar.storage.s3_multipart import (
    BAD_DIGEST_ATTEMPTS,
    Target,
    copy_in_parts,
    upload_in_parts,
)
from sidecar.storage.source import open_source
from sidecar.storage.url import DestinationUrl

if TYPE_CHECKING:
    from sidecar.config import DestinationConfig

__all__ = ["COPY_PART_SIZE", "COPY_PART_THRESHOLD", "S3Backend", "create"]

log = structlog.get_logger("sidecar.storage.s3")

#: CopyObject copies at most 5 GiB; above it, UploadPartCopy in parts of COPY_PART_SIZE.
COPY_PART_THRESHOLD = 5 * 1024**3
COPY_PART_SIZE = 512 * 1024**2


class S3Backend(Backend):
    """A bucket prefix on S3 or an S3-compatible store. Thread-safe."""

    scheme = "s3"

    def __init__(
        self,
        bucket: str,
        prefix: str = "",
        options: S3Options | None = None,
        *,
        allowed_regions: list[str] | None = None,
    ) -> None:
        self.options = options or S3Options()
        self.bucket = bucket
        self.prefix = prefix.strip("/")
        self.allowed_regions = list(allowed_regions or [])
        self.copy_part_threshold = COPY_PART_THRESHOLD
        self.copy_part_size = COPY_PART_SIZE
        self._client = make_client(
            self.options, pool_size=max(32, 4 * self.options.part_concurrency)
        )
        self._write_args = write_args(self.options)
        # Part buffers are reused while uploads run and dropped once none does.
        self._buffers = PartBuffers(self.options.part_concurrency)
        self._budget = Budget(self.options.part_concurrency, on_idle=self._buffers.clear)
        self._reader = ThreadPoolExecutor(1, thread_name_prefix="s3-read")
        # Part threads shared by every upload (and, apart, every multipart copy): started
        # on first use, never per file. As many as the budget has slots (see upload_in_parts).
        self._senders = ThreadPoolExecutor(
            self.options.part_concurrency, thread_name_prefix="s3-part"
        )
        self._copiers = ThreadPoolExecutor(
            self.options.part_concurrency, thread_name_prefix="s3-copy"
        )
        # Ranged GETs of every download together, as many at once as parts go up.
        self._getters = ThreadPoolExecutor(
            self.options.part_concurrency, thread_name_prefix="s3-get"
        )

    @property
    def url(self) -> str:
        return f"s3://{self.bucket}/{self.prefix}" if self.prefix else f"s3://{self.bucket}"

    @property
    def client(self) -> Any:
        """The botocore client (for tests and tools; same credentials chain)."""
        return self._client

    def object_key(self, key: str) -> str:
        """The full object key of a destination-relative ``key``."""
        check_key(key)
        return f"{self.prefix}/{key}" if self.prefix else key

    def _rel(self, full: str) -> str:
        return full[len(self.prefix) + 1 :] if self.prefix else full

    def _err(self, e: Exception, op: str, key: str | None = None) -> Exception:
        return map_error(e, op=op, bucket=self.bucket, key=key)

    def _put(self, key: str, body: bytes | memoryview, crc: str, **extra: Any) -> Any:
        """PutObject, sent again when the store answers BadDigest."""
        for attempt in range(1, BAD_DIGEST_ATTEMPTS + 1):
            try:
                return self._client.put_object(
                    Bucket=self.bucket,
                    Key=self.object_key(key),
                    Body=body,
                    ChecksumCRC32C=crc,
                    **self._write_args,
                    **extra,
                )
            except Exception as e:
                err = self._err(e, "PutObject", key)
                if isinstance(err, StoreRejectedChecksum) and attempt < BAD_DIGEST_ATTEMPTS:
                    log.warning("s3_put_bad_digest", key=key, attempt=attempt)
                    continue
                raise err from e
        raise AssertionError("unreachable")

    def put_file(self, key: str, path: Path, *, progress: Progress | None = None) -> ObjectInfo:
        """Stream ``path`` up; parts in parallel from ``multipart_threshold_bytes`` on.

        The file is read once, with its CRC32C in the same pass; ``progress`` is called for
        each part (or small file) as it is handed to the upload. Parts are read on the
        backend's one reading thread, a file below the threshold by the calling thread. All
        uploads of this backend together hold at most ``part_concurrency`` buffers of
        ``max(part_size_bytes, multipart_threshold_bytes)``.
        Cancelling aborts the multipart upload before re-raising.
        """
        full = self.object_key(key)
        size = os.stat(path, follow_symlinks=False).st_size  # the open refuses a link anyway
        opts = self.options
        if size >= opts.multipart_threshold_bytes:
            target = Target(self._client, self.bucket, full, self._write_args)
            total, whole = upload_in_parts(
                target,
                path,
                size,
                opts.part_size_bytes,
                self._budget,
                self._buffers,
                self._reader,
                self._senders,
                progress,
            )
            return ObjectInfo(key=key, size=total, crc32c=whole, mtime=time.time())
        self._budget.acquire()
        try:
            # Room to spare, so a log appended to while it is read goes up as read (the pool
            # tells a checkpoint file that changed by its stat afterwards); only growth past it
            # is read again.
            buf = self._buffers.take(min(opts.multipart_threshold_bytes, size + _SMALL_SLACK))
            try:
                body, crc = _read_small(path, buf, progress)  # no hand-off for a small file
                r = self._put(key, body, crc)
            finally:
                self._buffers.give(buf)
        finally:
            self._budget.release()
        return ObjectInfo(key=key, size=len(body), crc32c=crc, mtime=store_time(r))

    def put_bytes(self, key: str, data: bytes, *, create_only: bool = False) -> ObjectInfo:
        """PutObject; with ``create_only`` send ``If-None-Match: *`` (412 -> AlreadyExists)."""
        crc = Crc32c()
        crc.update(data)
        extra = {"IfNoneMatch": "*"} if create_only else {}
        r = self._put(key, data, crc.b64(), **extra)
        return ObjectInfo(key=key, size=len(data), crc32c=crc.b64(), mtime=store_time(r))

    def _get(self, key: str) -> Any:
        try:
            return self._client.get_object(
                Bucket=self.bucket, Key=self.object_key(key), ChecksumMode="ENABLED"
            )
        except Exception as e:
            raise self._err(e, "GetObject", key) from e

    def get_file(self, key: str, path: Path, *, progress: Progress | None = None) -> ObjectInfo:
        """Stream ``key`` into ``path``; compare with the store's whole-object CRC32C.

        An object larger than ``part_size_bytes`` comes in ranges of that size, up to
        ``part_concurrency`` GETs at once for all downloads of this backend, each pinned to
        the first GET's ETag (:mod:`.s3_download`). Raises :class:`ChecksumMismatch` (and
        removes ``path``) when the CRC32C of the bytes written differs from the store's.
        """
        return download(
            Source(self._client, self.bucket, self.object_key(key), key),
            self._get(key),
            path,
            range_size=self.options.part_size_bytes,
            pool=self._getters,
            progress=progress,
        )

    def get_bytes(self, key: str) -> bytes:
        r = self._get(key)
        try:
            data: bytes = r["Body"].read()
        except Exception as e:
            raise self._err(e, "GetObject", key) from e
        expected = full_crc(r)
        if expected is not None:
            crc = Crc32c()
            crc.update(data)
            if crc.b64() != expected:
                raise ChecksumMismatch(
                    f"{key}: read CRC32C {crc.b64()}, the store reports {expected}"
                )
        return data

    def head(self, key: str) -> ObjectInfo:
        """HeadObject; ``crc32c`` is the whole-object CRC32C or None (COMPOSITE or none)."""
        try:
            r = self._client.head_object(
                Bucket=self.bucket, Key=self.object_key(key), ChecksumMode="ENABLED"
            )
        except Exception as e:
            raise self._err(e, "HeadObject", key) from e
        return ObjectInfo(
            key=key,
            size=int(r["ContentLength"]),
            crc32c=full_crc(r),
            mtime=r["LastModified"].timestamp() if r.get("LastModified") else None,
        )

    def list(self, prefix: str = "") -> Iterator[ObjectInfo]:
        base = f"{self.prefix}/" if self.prefix else ""
        paginator = self._client.get_paginator("list_objects_v2")
        try:
            for page in paginator.paginate(Bucket=self.bucket, Prefix=base + prefix):
                for obj in page.get("Contents", []):
                    yield ObjectInfo(
                        key=self._rel(obj["Key"]),
                        size=int(obj["Size"]),
                        mtime=obj["LastModified"].timestamp(),
                    )
        except Exception as e:
            raise self._err(e, "ListObjectsV2", base + prefix) from e

    def delete(self, key: str) -> None:
        try:
            self._client.delete_object(Bucket=self.bucket, Key=self.object_key(key))
        except Exception as e:
            err = self._err(e, "DeleteObject", key)
            if not isinstance(err, NotFound):
                raise err from e

    def copy(self, src: str, dst: str) -> ObjectInfo:
        """CopyObject, or UploadPartCopy in parallel above 5 GiB; the data stays in the store."""
        info = self.head(src)
        source = {"Bucket": self.bucket, "Key": self.object_key(src)}
        target = Target(self._client, self.bucket, self.object_key(dst), self._write_args)
        if info.size > self.copy_part_threshold:
            copy_in_parts(
                target,
                source,
                info.size,
                info.crc32c,
                self.copy_part_size,
                self.options.part_concurrency,
                self._copiers,
            )
            return ObjectInfo(key=dst, size=info.size, crc32c=info.crc32c, mtime=time.time())
        try:
            r = self._client.copy_object(
                Bucket=self.bucket,
                Key=target.key,
                CopySource=source,
                ChecksumAlgorithm="CRC32C",
                **self._write_args,
            )
        except Exception as e:
            raise self._err(e, "CopyObject", dst) from e
        result = r.get("CopyObjectResult", {})
        return ObjectInfo(
            key=dst,
            size=info.size,
            crc32c=full_crc(result) or info.crc32c,
            mtime=result["LastModified"].timestamp() if result.get("LastModified") else None,
        )

    def check(self) -> None:
        """List the prefix (bucket, credentials and endpoint work), then, when
        ``allowed_regions`` is set, raise :class:`DestinationRejected` for a bucket in any
        other region (from GetBucketLocation)."""
        check_destination(self._client, self.bucket, self.prefix, self.allowed_regions)

    def cleanup_stale(self, older_than_seconds: float) -> int:
        """Abort multipart uploads under the prefix initiated at least ``older_than_seconds``
        before the store's current time."""
        return abort_stale_uploads(self._client, self.bucket, self.prefix, older_than_seconds)

    def close(self) -> None:
        self._reader.shutdown(wait=True)
        self._senders.shutdown(wait=True)
        self._copiers.shutdown(wait=True)
        self._getters.shutdown(wait=True)
        self._client.close()


#: Bytes a small file may grow by while it is read and still go up in that read.
_SMALL_SLACK = 64 * 1024


def _read_small(path: Path, buf: bytearray, progress: Progress | None) -> tuple[memoryview, str]:
    """A whole file below the multipart threshold, read into ``buf`` (a view of it), and its
    CRC32C. A file that grew to fill ``buf`` raises :class:`TransientError` (it is not read
    on into memory outside the part budget, however large it grew): the retry sizes it
    again, and takes the multipart path if it is large now."""
    crc = Crc32c()
    with open_source(path) as f:
        n = read_into(f, memoryview(buf), crc)
    if n == len(buf):
        raise TransientError(f"{path} grew while it was read; reading it again")
    body = memoryview(buf)[:n]
    if progress and body:
        progress(len(body))
    return body, crc.b64()


def create(url: DestinationUrl, dest: DestinationConfig) -> Backend:
    """Registry entry point: ``destination.url = s3://bucket/prefix`` plus ``destination.s3``."""
    return S3Backend(url.bucket, url.prefix, dest.s3, allowed_regions=list(dest.allowed_regions))
