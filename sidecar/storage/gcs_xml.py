"""GCS XML API multipart upload: parts sent in parallel, for very large files on real GCS.

The backend's reading thread reads the file once, in order, into the backend's reused
part buffers, updating the whole-file CRC32C; each part goes to one of the backend's part
threads with its own CRC32C in ``X-Goog-Hash`` so GCS checks every part. A part is read
only once it has a slot of the backend-wide :class:`~sidecar.storage.budget.Budget`, so
the parts of all uploads together stay within ``slots * part_size`` bytes of memory.
Nothing is visible until the final ``POST``; on any failure or :class:`Cancelled` the
upload is aborted (``DELETE ?uploadId=``).
Neither local emulator speaks this API: it is exercised against real GCS only, and
tested at the HTTP level.
"""

from __future__ import annotations

import concurrent.futures as cf
import io
import time
from datetime import datetime
from email.utils import parsedate_to_datetime
from typing import cast
from urllib.parse import quote
from xml.etree import ElementTree

import requests

from sidecar.storage import gcs_resumable
from sidecar.storage.base import Progress, StorageError, TransientError
from sidecar.storage.budget import Budget
from sidecar.storage.buffers import PartBuffers, read_into
from sidecar.storage.checksum import Crc32c
from sidecar.storage.gcs_errors import CorruptedInTransit, response_message, status_error
from sidecar.storage.gcs_resumable import TIMEOUT, is_transient_status
from sidecar.storage.parts import send_parts

__all__ = [
    "MAX_PARTS",
    "MIN_PART",
    "abort_stale_uploads",
    "object_url",
    "part_size_for",
    "upload_xml_multipart",
]

MIN_PART = 5 * 1024 * 1024
MAX_PARTS = 10_000


def part_size_for(size: int, wanted: int) -> int:
    """``wanted`` raised to the 5 MiB minimum and to fit in 10,000 parts."""
    need = -(-size // MAX_PARTS)
    return max(wanted, MIN_PART, need)


def object_url(base_url: str, bucket: str, name: str) -> str:
    return f"{base_url.rstrip('/')}/{bucket}/{quote(name, safe='/~')}"


class _Upload:
    def __init__(self, http: requests.Session, url: str, bucket: str, name: str) -> None:
        self.http, self.url, self.bucket, self.name = http, url, bucket, name
        self.upload_id = ""

    def _error(self, resp: requests.Response) -> StorageError:
        return status_error(
            resp.status_code,
            response_message(resp),
            op="multipart upload",
            bucket=self.bucket,
            name=self.name,
            bucket_level_404=not self.upload_id,
        )

    def _id_query(self) -> str:
        return f"uploadId={quote(self.upload_id, safe='')}"

    def initiate(self, headers: dict[str, str]) -> None:
        resp = self.http.post(f"{self.url}?uploads", headers=headers, timeout=TIMEOUT)
        if resp.status_code != 200:
            raise self._error(resp)
        root = ElementTree.fromstring(resp.content)  # noqa: S314 - the configured endpoint's answer
        found = [el.text for el in root.iter() if el.tag.rsplit("}", 1)[-1] == "UploadId"]
        if not found or not found[0]:
            raise TransientError(
                f"GCS multipart upload gs://{self.bucket}/{self.name}: no UploadId in the answer"
            )
        self.upload_id = found[0]

    def put_part(self, number: int, data: memoryview, crc: str) -> str:
        """Send one part (retrying transient failures); return its ETag. ``data`` is sent
        from where it is, in blocks, not copied (the session's ``BlockwiseAdapter`` wraps
        it anew for every send, so a request the session sends again itself, as google-auth
        does after refreshing a token on a 401, carries the whole part again)."""
        url = f"{self.url}?partNumber={number}&{self._id_query()}"
        headers = {"X-Goog-Hash": f"crc32c={crc}", "Content-Type": "application/octet-stream"}
        for pause in (*gcs_resumable.RETRY_PAUSES, None):
            try:
                body = cast("bytes", data)  # a memoryview: see BlockwiseAdapter
                resp = self.http.put(url, data=body, headers=headers, timeout=TIMEOUT)
            except requests.exceptions.RequestException:
                if pause is None:
                    raise TransientError(
                        f"GCS multipart upload gs://{self.bucket}/{self.name}: part {number} "
                        "failed to connect repeatedly"
                    ) from None
                time.sleep(pause)
                continue
            if resp.status_code == 200:
                echoed = _crc_from_hash_header(resp.headers.get("x-goog-hash", ""))
                if echoed is not None and echoed != crc:
                    raise CorruptedInTransit(
                        f"GCS multipart upload gs://{self.bucket}/{self.name}: part {number} "
                        f"stored with CRC32C {echoed}, sent {crc}"
                    )
                etag = resp.headers.get("ETag")
                if not etag:
                    raise TransientError(
                        f"GCS multipart upload gs://{self.bucket}/{self.name}: part {number} "
                        "answer has no ETag"
                    )
                return etag
            if pause is None or not is_transient_status(resp.status_code):
                raise self._error(resp)
            time.sleep(pause)
        raise AssertionError("unreachable")

    def complete(self, etags: dict[int, str]) -> None:
        root = ElementTree.Element("CompleteMultipartUpload")
        for number in sorted(etags):
            part = ElementTree.SubElement(root, "Part")
            ElementTree.SubElement(part, "PartNumber").text = str(number)
            ElementTree.SubElement(part, "ETag").text = etags[number]
        resp = self.http.post(
            f"{self.url}?{self._id_query()}",
            data=ElementTree.tostring(root),
            headers={"Content-Type": "application/xml"},
            timeout=TIMEOUT,
        )
        if resp.status_code != 200 or b"<Error" in resp.content[:200]:
            raise self._error(resp)

    def abort(self) -> bool:
        """Best effort; True when GCS confirmed (204)."""
        if not self.upload_id:
            return False
        try:
            resp = self.http.delete(f"{self.url}?{self._id_query()}", timeout=(5.0, 30.0))
        except requests.exceptions.RequestException:
            return False
        return resp.status_code in (200, 204)


def _crc_from_hash_header(value: str) -> str | None:
    for item in value.split(","):
        algo, _, digest = item.strip().partition("=")
        if algo == "crc32c" and digest:
            return digest
    return None


def upload_xml_multipart(
    http: requests.Session,
    base_url: str,
    bucket: str,
    name: str,
    f: io.BufferedIOBase,
    size: int,
    *,
    part_size: int,
    budget: Budget,
    buffers: PartBuffers,
    pool: cf.Executor,
    reader: cf.Executor,
    headers: dict[str, str],
    progress: Progress | None = None,
) -> str:
    """Upload ``size`` bytes of ``f`` as ``gs://bucket/name``; return the whole-file CRC32C.

    Each part in memory holds a ``budget`` slot (the backend's, shared by every upload)
    and a buffer of ``buffers`` from its read until its request is done (whatever the
    outcome), and is sent on ``pool`` (the backend's part threads, as many as ``budget``
    has slots); every part is read on ``reader`` (the backend's one reading thread).
    ``headers`` go on the initiating request (``x-goog-storage-class``,
    ``x-goog-encryption-kms-key-name``). ``progress`` gets each
    part's size once GCS holds it, before the object is assembled. Raises
    :class:`TransientError` if the file shrinks while read, else the mapped
    :class:`StorageError`; in every case the upload is aborted first.
    """
    up = _Upload(http, object_url(base_url, bucket, name), bucket, name)
    part_size = part_size_for(size, part_size)
    crc = Crc32c()
    etags: dict[int, str] = {}
    offset = number = 0

    def next_part() -> tuple[int, bytearray, memoryview, str] | None:
        nonlocal offset, number
        if offset >= size:
            return None
        want = min(part_size, size - offset)
        buf = buffers.take(want)
        part = Crc32c()  # one pass: the part's CRC32C also extends the whole file's
        got = read_into(f, memoryview(buf)[:want], part)
        if got != want:
            buffers.give(buf)
            raise TransientError(
                f"GCS multipart upload gs://{bucket}/{name}: the file shrank while it "
                f"was read ({offset + got} of {size} bytes); it is sent again "
                "once stable"
            )
        crc.extend(part.value(), want)
        number += 1
        offset += want
        return number, buf, memoryview(buf)[:want], part.b64()

    def send(part: tuple[int, bytearray, memoryview, str]) -> tuple[int, str, int]:
        n, buf, data, part_crc = part
        try:
            return n, up.put_part(n, data, part_crc), len(data)
        finally:
            buffers.give(buf)

    def on_sent(result: tuple[int, str, int]) -> None:
        n, etag, length = result
        etags[n] = etag
        if progress is not None:
            progress(length)

    try:
        up.initiate({"Content-Type": "application/octet-stream", **headers})
        send_parts(next_part, send, on_sent, budget=budget, pool=pool, reader=reader)
        up.complete(etags)
        return crc.b64()
    except BaseException:
        up.abort()
        raise


def _local(tag: str) -> str:
    return tag.rsplit("}", 1)[-1]


def abort_stale_uploads(
    http: requests.Session, base_url: str, bucket: str, prefix: str, older_than_seconds: float
) -> int:
    """Abort the XML multipart uploads under ``prefix`` begun more than the given age ago.

    Age is measured by the store's clock (its ``Date`` header against each upload's
    ``Initiated``), never ours. Returns how many were aborted; raises the mapped
    :class:`StorageError` when listing fails.
    """
    removed = 0
    markers = ""
    while True:
        resp = http.get(
            f"{base_url.rstrip('/')}/{bucket}?uploads&prefix={quote(prefix, safe='')}{markers}",
            timeout=TIMEOUT,
        )
        if resp.status_code != 200:
            raise status_error(
                resp.status_code,
                response_message(resp),
                op="list multipart uploads",
                bucket=bucket,
                name=prefix or None,
                bucket_level_404=True,
            )
        date = resp.headers.get("Date")
        now = parsedate_to_datetime(date).timestamp() if date else time.time()
        root = ElementTree.fromstring(resp.content)  # noqa: S314 - the configured endpoint's answer
        for upload in (el for el in root if _local(el.tag) == "Upload"):
            fields = {_local(el.tag): el.text or "" for el in upload}
            initiated = datetime.fromisoformat(fields.get("Initiated", "")).timestamp()
            if now - initiated <= older_than_seconds:
                continue
            stale = _Upload(
                http, object_url(base_url, bucket, fields["Key"]), bucket, fields["Key"]
            )
            stale.upload_id = fields["UploadId"]
            if stale.abort():
                removed += 1
        fields = {_local(el.tag): el.text or "" for el in root}
        if fields.get("IsTruncated", "").lower() != "true":
            return removed
        markers = (
            f"&key-marker={quote(fields.get('NextKeyMarker', ''), safe='')}"
            f"&upload-id-marker={quote(fields.get('NextUploadIdMarker', ''), safe='')}"
        )
