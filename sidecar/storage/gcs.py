"""``gs://bucket/prefix`` destinations, with google-cloud-storage.

Keys are relative to the prefix. Files up to 1 MiB (and at most one chunk) go up in one
request carrying their CRC32C in the object metadata; larger ones stream through a resumable
session (:mod:`sidecar.storage.gcs_resumable`), and very large ones on real GCS through
the XML multipart API (:mod:`sidecar.storage.gcs_xml`). Either way the CRC32C is
computed while the file is read and GCS checks it before the object exists; the object
GCS reports is compared once more, and one whose CRC32C differs is deleted
(:class:`~sidecar.storage.gcs_errors.CorruptedInTransit`). Create-only writes use
``ifGenerationMatch=0``; copies use ``rewrite``, so no bytes pass through this process.

Credentials: see :mod:`sidecar.storage.gcs_client`; never logged or put in a message.
"""

from __future__ import annotations

import concurrent.futures as cf
import contextlib
import io
import os
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import requests
from google.api_core import exceptions as api_exceptions
from google.auth import exceptions as auth_exceptions
from google.cloud import storage
from google.cloud.storage import exceptions as storage_exceptions
from google.cloud.storage.retry import DEFAULT_RETRY

from sidecar.storage.base import (
    Backend,
    DestinationRejected,
    ObjectInfo,
    PermanentError,
    Progress,
    StorageError,
)
from sidecar.storage.body import BLOCK
from sidecar.storage.budget import Budget
from sidecar.storage.buffers import PartBuffers
from sidecar.storage.checksum import Crc32c
from sidecar.storage.gcs_client import connect
from sidecar.storage.gcs_download import download
from sidecar.storage.gcs_errors import CorruptedInTransit, map_error
from sidecar.storage.gcs_io import info_of, resource_of
from sidecar.storage.gcs_resumable import upload_resumable
from sidecar.storage.gcs_xml import abort_stale_uploads, upload_xml_multipart
from sidecar.storage.keys import check_key
from sidecar.storage.options import GcsOptions
from sidecar.storage.source import open_source
from sidecar.storage.url import DestinationUrl

if TYPE_CHECKING:
    from sidecar.config import DestinationConfig

__all__ = ["GcsBackend", "create"]

#: Files up to this size go up in one request, read whole: the library builds that request's
#: body from the bytes, so such a file is held about three times over while it goes up (18.9
#: MB traced for a 6 MiB file, tests/storage/test_gcs_uploads.py). Larger files stream
#: through a resumable session (one request more), a block at a time. At 8 MiB (the
#: library's own cut-off) the daemon peaked at 150.3-152.7 MB on 10 GiB of files of 1-64 MiB,
#: four at once; at one block (1 MiB), 88.7-88.9 MB (bench/memory.md).
SIMPLE_MAX = BLOCK
XML_AUTO_THRESHOLD = 1024**3
_TIMEOUT = (10.0, 120.0)
_RETRY = DEFAULT_RETRY.with_timeout(30.0)  # idempotent calls only; the pool retries the rest
_CHECK_RETRY = DEFAULT_RETRY.with_timeout(10.0)  # at start: a network coming up, not an outage
_LIBRARY_ERRORS = (
    api_exceptions.GoogleAPIError,
    auth_exceptions.GoogleAuthError,
    storage_exceptions.InvalidResponse,
    storage_exceptions.DataCorruption,
    requests.exceptions.RequestException,
)


def create(url: DestinationUrl, dest: DestinationConfig) -> Backend:
    """The registry's entry point; reads ``STORAGE_EMULATOR_HOST`` from the environment."""
    return GcsBackend(
        url.bucket,
        url.prefix,
        dest.gcs,
        allowed_regions=dest.allowed_regions,
        emulator_host=os.environ.get("STORAGE_EMULATOR_HOST") or None,
    )


class GcsBackend(Backend):
    """A GCS bucket prefix. Thread-safe: one HTTP connection pool shared by all calls."""

    scheme = "gs"
    lists_crc32c = True

    def __init__(
        self,
        bucket: str,
        prefix: str,
        options: GcsOptions | None = None,
        *,
        allowed_regions: list[str] | tuple[str, ...] = (),
        emulator_host: str | None = None,
    ) -> None:
        self.options = options or GcsOptions()
        self.bucket_name = bucket
        self.prefix = prefix.strip("/")
        self._root = f"{self.prefix}/" if self.prefix else ""
        self._allowed = [r.upper() for r in allowed_regions]
        self._emulator = emulator_host is not None
        self._http, self._client = connect(self.options, emulator_host)
        self._bucket = self._client.bucket(bucket)
        threshold = self.options.xml_multipart_threshold_bytes
        if threshold is None:
            threshold = 0 if self._emulator else XML_AUTO_THRESHOLD
        self._xml_threshold = threshold
        # XML multipart parts of every upload share one budget and one pool of part threads
        # (threads start on first use); see gcs_xml.upload_xml_multipart
        self._buffers = PartBuffers(self.options.part_concurrency)
        self._budget = Budget(self.options.part_concurrency, on_idle=self._buffers.clear)
        self._parts = cf.ThreadPoolExecutor(
            self.options.part_concurrency, thread_name_prefix="gcs-part"
        )
        self._reader = cf.ThreadPoolExecutor(1, thread_name_prefix="gcs-read")
        # Ranged GETs of every download together, as many at once as parts go up.
        self._getters = cf.ThreadPoolExecutor(
            self.options.part_concurrency, thread_name_prefix="gcs-get"
        )
        self._closed = False

    @property
    def url(self) -> str:
        return (
            f"gs://{self.bucket_name}/{self.prefix}" if self.prefix else f"gs://{self.bucket_name}"
        )

    def _name(self, key: str) -> str:
        return self._root + check_key(key)

    def _blob(self, name: str, *, writing: bool = False) -> storage.Blob:
        if not writing:
            return self._bucket.blob(name)
        blob = self._bucket.blob(name, kms_key_name=self.options.kms_key_name)
        if self.options.storage_class:
            blob.storage_class = self.options.storage_class
        return blob

    @contextlib.contextmanager
    def _errors(self, op: str, name: str | None = None, **kw: bool) -> Iterator[None]:
        """Turn library, auth and connection errors into :class:`StorageError` (one line)."""
        try:
            yield
        except StorageError:
            raise
        except _LIBRARY_ERRORS as e:
            raise map_error(e, op=op, bucket=self.bucket_name, name=name, **kw) from None

    # -- writes -------------------------------------------------------------------------

    def put_file(self, key: str, path: Path, *, progress: Progress | None = None) -> ObjectInfo:
        name = self._name(key)
        with open_source(path) as f:
            size = os.fstat(f.fileno()).st_size
            if size <= min(SIMPLE_MAX, self.options.chunk_size_bytes or SIMPLE_MAX):
                data = f.read(size)
                if progress is not None and data:
                    progress(len(data))  # before sending: a Cancelled here leaves nothing
                return self._put_small(key, name, data, create_only=False)
            if self._xml_threshold and size >= self._xml_threshold:
                return self._put_xml(key, name, f, size, progress)
            blob = self._blob(name, writing=True)
            with self._errors("upload", name, bucket_level_404=True):
                session_url = blob.create_resumable_upload_session(
                    content_type="application/octet-stream",
                    size=size,
                    checksum=None,
                    timeout=_TIMEOUT,
                    retry=_RETRY,
                )
            with self._errors("upload", name):
                crc, resource = upload_resumable(
                    self._http,
                    session_url,
                    f,
                    size,
                    chunk_size=self.options.chunk_size_bytes,
                    bucket=self.bucket_name,
                    name=name,
                    progress=progress,
                )
        return self._verified(key, name, crc, size, resource)

    def _put_small(self, key: str, name: str, data: bytes, *, create_only: bool) -> ObjectInfo:
        crc = Crc32c()
        crc.update(data)
        blob = self._blob(name, writing=True)
        blob.crc32c = crc.b64()  # sent in the metadata: GCS refuses other bytes
        kind = "application/json" if name.endswith(".json") else "application/octet-stream"
        with self._errors("upload", name, bucket_level_404=True):
            blob.upload_from_string(
                data,
                content_type=kind,
                checksum=None,
                timeout=_TIMEOUT,
                retry=None,
                if_generation_match=0 if create_only else None,
            )
        return self._verified(key, name, crc.b64(), len(data), resource_of(blob))

    def _put_xml(
        self, key: str, name: str, f: io.BufferedIOBase, size: int, progress: Progress | None
    ) -> ObjectInfo:
        headers: dict[str, str] = {}
        if self.options.storage_class:
            headers["x-goog-storage-class"] = self.options.storage_class
        if self.options.kms_key_name:
            headers["x-goog-encryption-kms-key-name"] = self.options.kms_key_name
        with self._errors("multipart upload", name):
            crc = upload_xml_multipart(
                self._http,
                self._client.api_endpoint,
                self.bucket_name,
                name,
                f,
                size,
                part_size=self.options.xml_part_size_bytes,
                budget=self._budget,
                buffers=self._buffers,
                pool=self._parts,
                reader=self._reader,
                headers=headers,
                progress=progress,
            )
        blob = self._blob(name)
        with self._errors("upload", name):
            blob.reload(timeout=_TIMEOUT, retry=_RETRY)
        return self._verified(key, name, crc, size, resource_of(blob))

    def _verified(
        self, key: str, name: str, crc: str, size: int, resource: dict[str, Any]
    ) -> ObjectInfo:
        """Compare what GCS stored with what was read; delete a damaged object."""
        stored_crc = resource.get("crc32c")
        raw_size = resource.get("size")
        stored_size = size if raw_size is None else int(raw_size)
        if (stored_crc is not None and stored_crc != crc) or stored_size != size:
            generation = resource.get("generation")
            with contextlib.suppress(*_LIBRARY_ERRORS):
                self._blob(name).delete(
                    if_generation_match=int(generation) if generation else None,
                    timeout=_TIMEOUT,
                )
            raise CorruptedInTransit(
                f"GCS upload gs://{self.bucket_name}/{name}: stored {stored_size} bytes with "
                f"CRC32C {stored_crc}, sent {size} bytes with {crc}; deleted, to be sent again"
            )
        return info_of(key, {**resource, "crc32c": crc, "size": size})

    def put_bytes(self, key: str, data: bytes, *, create_only: bool = False) -> ObjectInfo:
        return self._put_small(key, self._name(key), data, create_only=create_only)

    def copy(self, src: str, dst: str) -> ObjectInfo:
        source, target = self._blob(self._name(src)), self._blob(self._name(dst), writing=True)
        token: str | None = None
        with self._errors("copy", source.name):
            while True:
                token, _, _ = target.rewrite(source, token=token, timeout=_TIMEOUT, retry=_RETRY)
                if token is None:
                    break
        return info_of(dst, resource_of(target))

    def delete(self, key: str) -> None:
        name = self._name(key)
        with self._errors("delete", name), contextlib.suppress(api_exceptions.NotFound):
            self._blob(name).delete(timeout=_TIMEOUT, retry=_RETRY)

    # -- reads --------------------------------------------------------------------------

    def get_file(self, key: str, path: Path, *, progress: Progress | None = None) -> ObjectInfo:
        """Download ``key`` into ``path``; compare with the store's CRC32C when it sends one.

        An object larger than ``xml_part_size_bytes`` comes in ranges of that size (a
        sliced download), up to ``part_concurrency`` GETs at once for all downloads of this
        backend, each of the generation the first GET named (:mod:`.gcs_download`). On any
        failure ``path`` is removed."""
        name = self._name(key)
        with self._errors("download", name):  # token refresh
            size, crc = download(
                self._http,
                self._client.api_endpoint,
                self.bucket_name,
                name,
                path,
                range_size=self.options.xml_part_size_bytes,
                pool=self._getters,
                progress=progress,
            )
        return ObjectInfo(key=key, size=size, crc32c=crc, mtime=None)

    def get_bytes(self, key: str) -> bytes:
        name = self._name(key)
        with self._errors("download", name):
            data: bytes = self._blob(name).download_as_bytes(
                raw_download=True, checksum="crc32c", timeout=_TIMEOUT, retry=_RETRY
            )
        return data

    def head(self, key: str) -> ObjectInfo:
        name = self._name(key)
        blob = self._blob(name)
        with self._errors("head", name):
            blob.reload(timeout=_TIMEOUT, retry=_RETRY)
        return info_of(key, resource_of(blob))

    def list(self, prefix: str = "") -> Iterator[ObjectInfo]:
        start = len(self._root)
        with self._errors("list", self._root + prefix):
            for blob in self._client.list_blobs(
                self._bucket,
                prefix=self._root + prefix,
                timeout=_TIMEOUT,
                retry=_RETRY,
                fields="items(name,size,crc32c,updated,generation),nextPageToken",
            ):
                key = blob.name[start:]
                if key and not key.endswith("/"):  # skip console "folder" placeholders
                    yield info_of(key, resource_of(blob))

    # -- lifecycle ----------------------------------------------------------------------

    def check(self) -> None:
        """Bucket reachable and writable by these credentials, and in an allowed region.

        Raises :class:`DestinationRejected` when ``destination.allowed_regions`` is set and
        the bucket's location is not in it, :class:`PermanentError` for a missing bucket,
        bad credentials or missing permissions.
        """
        with self._errors("check", starting=True, bucket_level_404=True):
            try:
                self._bucket.reload(timeout=_TIMEOUT, retry=_CHECK_RETRY)
            except api_exceptions.Forbidden:
                if self._allowed:
                    raise PermanentError(
                        f"GCS check gs://{self.bucket_name}: cannot read the bucket's location "
                        "(403) to check destination.allowed_regions; grant the service account "
                        "storage.buckets.get on it (roles/storage.legacyBucketReader has it) "
                        "or clear allowed_regions"
                    ) from None
                probe = self._client.list_blobs(
                    self._bucket, prefix=self._root, max_results=1, retry=_CHECK_RETRY
                )
                next(iter(probe), None)
                return
        location = str(self._bucket.location or "").upper()
        if self._allowed and location not in self._allowed:
            raise DestinationRejected(
                f"GCS bucket gs://{self.bucket_name} is in {location or 'an unknown location'} "
                f"({self._bucket.location_type or 'unknown type'}), which is not in "
                f"destination.allowed_regions {[r.lower() for r in self._allowed]}; use a bucket "
                "in an allowed region or add its location to the list"
            )

    def cleanup_stale(self, older_than_seconds: float) -> int:
        """Abort XML multipart uploads under the prefix older than the age (store's clock).

        Resumable sessions need nothing: they hold no object and GCS drops them after a
        week. Returns 0 at once when the XML path is off (as on the emulators).
        """
        if not self._xml_threshold:
            return 0
        with self._errors("cleanup", self._root or None):
            return abort_stale_uploads(
                self._http,
                self._client.api_endpoint,
                self.bucket_name,
                self._root,
                older_than_seconds,
            )

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            self._parts.shutdown(wait=True, cancel_futures=True)
            self._reader.shutdown(wait=True)
            self._getters.shutdown(wait=True)
            self._client.close()
            self._http.close()  # type: ignore[no-untyped-call]
