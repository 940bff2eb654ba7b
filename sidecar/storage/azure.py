"""``az://container/prefix`` and ``https://<account>.blob.core.windows.net/container/prefix``.

Files go up as block blobs: blocks staged in parallel, each with a transactional CRC-64
(``x-ms-content-crc64``) the service verifies, then one Put Block List makes the blob
visible at once (a cancelled or failed upload commits nothing; an older blob at the key
stays readable). A file of at most one block (and at most :data:`SINGLE_PUT_MAX`) goes in
one Put Blob with a Content-MD5 the service verifies instead: one request, not two. The
whole-file CRC32C,
computed in the same read pass, is stored as blob metadata ``crc32c`` and reported by
``head`` and ``list``. Create-only writes send ``If-None-Match: *``. ``copy`` is the
service's Copy Blob from the source URL, polled until the service reports it done; with a
customer-provided key or an encryption scope it raises, so the caller uploads instead.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any, BinaryIO, cast

from azure.core import MatchConditions
from azure.core.exceptions import AzureError
from azure.storage.blob import (
    BlobBlock,
    BlobClient,
    BlobProperties,
    ContainerClient,
    StandardBlobTier,
)

from sidecar.storage.azure_blocks import block_size_for, stage_file
from sidecar.storage.azure_client import DOWNLOAD_GET_BYTES, build_container_client, customer_key
from sidecar.storage.azure_copy import wait_for_copy
from sidecar.storage.azure_download import download
from sidecar.storage.azure_errors import map_error
from sidecar.storage.base import (
    Backend,
    DestinationRejected,
    NotFound,
    ObjectInfo,
    PermanentError,
    Progress,
    StorageError,
)
from sidecar.storage.body import BytesBody
from sidecar.storage.budget import Budget
from sidecar.storage.buffers import PartBuffers
from sidecar.storage.checksum import crc32c_of_bytes
from sidecar.storage.keys import check_key
from sidecar.storage.options import AzureOptions
from sidecar.storage.source import open_source
from sidecar.storage.url import DestinationUrl

if TYPE_CHECKING:
    from sidecar.config import DestinationConfig

__all__ = ["AzureBackend", "create"]

CRC_METADATA = "crc32c"
#: files up to this size (and one block) go up in one Put Blob
SINGLE_PUT_MAX = 8 * 1024 * 1024


def create(url: DestinationUrl, dest: DestinationConfig) -> Backend:
    """The backend for a parsed ``az`` destination; raises :class:`PermanentError`."""
    target = build_container_client(url, dest.azure)
    backend = AzureBackend(target.container, url.prefix, dest.azure, account=target.account)
    backend.allowed_regions = list(dest.allowed_regions)
    backend.display_url = url.raw
    return backend


def _mtime(response: dict[str, Any]) -> float:
    when = response.get("last_modified")
    return when.timestamp() if isinstance(when, datetime) else time.time()


class AzureBackend(Backend):
    """A prefix inside one Azure Blob container. Thread-safe: every upload shares one budget
    of ``max_concurrency`` blocks in memory and one pool of as many block threads."""

    scheme = "az"

    def __init__(
        self, container: ContainerClient, prefix: str, opts: AzureOptions, *, account: str
    ) -> None:
        self._container = container
        self._prefix = prefix.strip("/")
        self._root = f"{self._prefix}/" if self._prefix else ""
        self._opts = opts
        self.account = account
        self.allowed_regions: list[str] = []
        self.display_url = f"az://{container.container_name}/{self._prefix}".rstrip("/")
        self._cpk = customer_key(opts)
        # a listing leaves out the metadata (our CRC32C) of blobs under a customer key
        self.lists_crc32c = self._cpk is None
        if self._cpk is not None and not container.url.lower().startswith("https://"):
            raise PermanentError("destination.azure.customer_provided_key needs an https endpoint")
        self._scope = opts.encryption_scope
        self._tier = StandardBlobTier(opts.access_tier) if opts.access_tier else None
        # Blocks in memory for every upload of this backend together, and the threads that
        # stage them, shared by every upload: started on first use, never per file. As many
        # threads as the budget has slots (see stage_file).
        self._buffers = PartBuffers(opts.max_concurrency)
        self._budget = Budget(opts.max_concurrency, on_idle=self._buffers.clear)
        self._blocks = ThreadPoolExecutor(opts.max_concurrency, thread_name_prefix="azure-block")
        self._reader = ThreadPoolExecutor(1, thread_name_prefix="azure-read")
        # Ranged GETs of every download together, as many at once as blocks go up.
        self._getters = ThreadPoolExecutor(opts.max_concurrency, thread_name_prefix="azure-get")

    @property
    def url(self) -> str:
        return self.display_url

    @property
    def container_name(self) -> str:
        return str(self._container.container_name)

    def _name(self, key: str) -> str:
        check_key(key)
        return self._root + key

    def _blob(self, key: str) -> BlobClient:
        return self._container.get_blob_client(self._name(key))

    @contextlib.contextmanager
    def _errors(self, op: str, key: str, *, starting: bool = False) -> Iterator[None]:
        try:
            yield
        except AzureError as e:
            raise map_error(
                e,
                op=op,
                account=self.account,
                container=self.container_name,
                key=key,
                starting=starting,
            ) from None

    def _info(self, key: str, props: BlobProperties) -> ObjectInfo:
        mtime = props.last_modified.timestamp() if props.last_modified else None
        crc = (props.metadata or {}).get(CRC_METADATA)
        return ObjectInfo(key=key, size=int(props.size), crc32c=crc, mtime=mtime)

    def put_file(self, key: str, path: Path, *, progress: Progress | None = None) -> ObjectInfo:
        with open_source(path) as f:
            size = os.fstat(f.fileno()).st_size
            if size <= min(SINGLE_PUT_MAX, self._opts.block_size_bytes):
                return self._put_single(key, f, size, progress)
            blob = self._blob(key)

            def stage(block_id: str, data: memoryview, crc64: bytes) -> None:
                with self._errors("upload", key):
                    blob.stage_block(
                        block_id,
                        # a file over the buffer: sent from it in blocks, not copied
                        cast("IO[bytes]", BytesBody(data)),
                        length=len(data),
                        transactional_content_crc64=crc64,
                        cpk=self._cpk,
                        encryption_scope=self._scope,
                    )

            staged = stage_file(
                f,
                stage,
                block_size=block_size_for(size, self._opts.block_size_bytes),
                budget=self._budget,
                buffers=self._buffers,
                pool=self._blocks,
                reader=self._reader,
                progress=progress,
            )
        crc = staged.crc.b64()
        with self._errors("commit", key):
            done: dict[str, Any] = blob.commit_block_list(
                [BlobBlock(block_id=i) for i in staged.block_ids],
                metadata={CRC_METADATA: crc},
                standard_blob_tier=self._tier,
                cpk=self._cpk,
                encryption_scope=self._scope,
            )
        return ObjectInfo(key=key, size=staged.size, crc32c=crc, mtime=_mtime(done))

    def _put_single(
        self, key: str, f: BinaryIO, size: int, progress: Progress | None
    ) -> ObjectInfo:
        """One Put Blob of the file's ``size`` bytes, holding a budget slot while they are
        in memory (the SDK wants ``bytes`` for it, not a pooled buffer, so a free buffer
        makes room for them); ``progress`` is told before the request, so a Cancelled
        leaves nothing."""
        self._budget.acquire()
        self._buffers.make_room()
        try:
            data = self._reader.submit(f.read, size).result()
            if progress is not None and data:
                progress(len(data))
            return self._put_blob(key, data, create_only=False, op="upload")
        finally:
            self._budget.release()

    def put_bytes(self, key: str, data: bytes, *, create_only: bool = False) -> ObjectInfo:
        op = "create-only write" if create_only else "write"
        return self._put_blob(key, data, create_only=create_only, op=op)

    def _put_blob(self, key: str, data: bytes, *, create_only: bool, op: str) -> ObjectInfo:
        """Put Blob with a Content-MD5 and the CRC32C in metadata; errors name ``op``."""
        crc = crc32c_of_bytes(data)
        with self._errors(op, key):
            done: dict[str, Any] = self._blob(key).upload_blob(
                data,
                overwrite=not create_only,
                validate_content=True,
                metadata={CRC_METADATA: crc},
                # If-None-Match: * (passing etag="*" as well raises TypeError in the SDK)
                match_condition=MatchConditions.IfMissing if create_only else None,
                standard_blob_tier=self._tier,
                cpk=self._cpk,
                encryption_scope=self._scope,
            )
        return ObjectInfo(key=key, size=len(data), crc32c=crc, mtime=_mtime(done))

    def get_file(self, key: str, path: Path, *, progress: Progress | None = None) -> ObjectInfo:
        """Download ``key`` into ``path``, computing its CRC32C as the bytes arrive.

        A blob larger than one GET (:data:`~.azure_client.DOWNLOAD_GET_BYTES`) comes in
        ranges of that size, up to ``max_concurrency`` GETs at once for all downloads of
        this backend, each pinned to the first GET's ETag (:mod:`.azure_download`). On any
        failure ``path`` is removed."""
        blob = self._blob(key)
        with self._errors("download", key):
            first = blob.download_blob(cpk=self._cpk)

        def mapped(e: AzureError, op: str) -> StorageError:
            return map_error(e, op=op, account=self.account, container=self.container_name, key=key)

        return download(
            blob,
            first,
            path,
            key=key,
            range_size=DOWNLOAD_GET_BYTES,
            pool=self._getters,
            map_error=mapped,
            progress=progress,
            cpk=self._cpk,
        )

    def get_bytes(self, key: str) -> bytes:
        with self._errors("read", key):
            data: bytes = self._blob(key).download_blob(cpk=self._cpk).readall()
        return data

    def head(self, key: str) -> ObjectInfo:
        with self._errors("head", key):
            props = self._blob(key).get_blob_properties(cpk=self._cpk)
        return self._info(key, props)

    def list(self, prefix: str = "") -> Iterator[ObjectInfo]:
        with self._errors("list", prefix or "/"):
            for props in self._container.list_blobs(
                name_starts_with=self._root + prefix, include=["metadata"]
            ):
                yield self._info(props.name[len(self._root) :], props)

    def delete(self, key: str) -> None:
        with contextlib.suppress(NotFound), self._errors("delete", key):
            self._blob(key).delete_blob(delete_snapshots="include")

    def copy(self, src: str, dst: str) -> ObjectInfo:
        if self._cpk is not None or self._scope:
            # Copy Blob can neither read a customer-key source nor set a scope on the copy
            # (the SDK allows a scope only on the synchronous copy, which needs a source SAS).
            raise StorageError("no Azure server-side copy with customer key or encryption scope")
        source = self._blob(src)
        target = self._blob(dst)
        with self._errors("copy", src):
            source.get_blob_properties(cpk=self._cpk)
        with self._errors("copy", dst):
            started = target.start_copy_from_url(source.url, standard_blob_tier=self._tier)
            wait_for_copy(
                str(started.get("copy_status")),
                lambda: target.get_blob_properties(cpk=self._cpk).copy.status,
                lambda: target.abort_copy(str(started["copy_id"])),
                what=f"Azure copy of {src!r} to {dst!r}",
                timeout=self._opts.copy_timeout_seconds,
            )
        return self.head(dst)

    def check(self) -> None:
        if self.allowed_regions:
            region = self._opts.region
            if region is None:
                raise DestinationRejected(
                    "destination.allowed_regions is set but Azure does not report an account's "
                    "region to the data plane: set destination.azure.region to the account's region"
                )
            if region not in self.allowed_regions:
                raise DestinationRejected(
                    f"Azure account {self.account!r} is in {region!r}, "
                    f"outside destination.allowed_regions {self.allowed_regions}"
                )
        with self._errors("access check (list)", "/", starting=True):
            pages = self._container.list_blobs(name_starts_with=self._root, results_per_page=1)
            next(iter(pages.by_page()), None)

    def close(self) -> None:
        self._blocks.shutdown(wait=True)
        self._reader.shutdown(wait=True)
        self._getters.shutdown(wait=True)
        with contextlib.suppress(StorageError, AzureError):
            self._container.close()
