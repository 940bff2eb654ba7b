"""The XML multipart path, at the HTTP level: neither emulator speaks this API, so the
recording look-alike plays GCS and the requests are checked one by one."""

from __future__ import annotations

import concurrent.futures as cf
import io
import os
import re
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
import requests
from google.auth.transport.requests import AuthorizedSession
from google.oauth2.credentials import Credentials

from sidecar.storage import gcs_resumable
from sidecar.storage.base import Cancelled, ChecksumMismatch, PermanentError, TransientError
from sidecar.storage.blockwise import BlockwiseAdapter
from sidecar.storage.budget import Budget
from sidecar.storage.buffers import PartBuffers
from sidecar.storage.checksum import crc32c_of_bytes
from sidecar.storage.gcs import GcsBackend
from sidecar.storage.gcs_xml import part_size_for, upload_xml_multipart
from tests.servers.gcs import GcsRecorder, Sunk, gcs_backend

MiB = 1024 * 1024
PART = 5 * MiB
KMS = "projects/p/locations/europe-west4/keyRings/r/cryptoKeys/k"


@pytest.fixture(autouse=True)
def _no_pauses(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(gcs_resumable, "RETRY_PAUSES", (0.0, 0.0, 0.0))


@pytest.fixture
def src(tmp_path: Path) -> Iterator[tuple[Path, bytes]]:
    data = os.urandom(3 * PART + 4321)  # four parts
    path = tmp_path / "shard-0.safetensors"
    path.write_bytes(data)
    yield path, data


def _backend(recorder: GcsRecorder, **options: object) -> GcsBackend:
    options = {"part_concurrency": 2, **options}
    return gcs_backend(
        recorder.url, "b", "run", xml_part_size_bytes=PART, xml_multipart_threshold_bytes=PART,
        **options,
    )  # fmt: skip


def test_parts_carry_their_crc32c_and_complete_lists_them_in_order(
    gcs_recorder: GcsRecorder, src: tuple[Path, bytes]
) -> None:
    path, data = src
    backend = _backend(gcs_recorder, storage_class="COLDLINE", kms_key_name=KMS)
    seen: list[int] = []
    info = backend.put_file("step 5/shard-0.safetensors", path, progress=seen.append)

    (start,) = gcs_recorder.seen("POST", "uploads")
    assert start.path == "/b/run/step 5/shard-0.safetensors"
    assert start.headers["x-goog-storage-class"] == "COLDLINE"
    assert start.headers["x-goog-encryption-kms-key-name"] == KMS
    parts = sorted(gcs_recorder.seen("PUT", "partNumber"), key=lambda r: int(r.query["partNumber"]))
    assert [int(p.query["partNumber"]) for p in parts] == [1, 2, 3, 4]
    assert {p.query["uploadId"] for p in parts} == {_upload_id(gcs_recorder)}
    for p in parts:
        assert p.headers["x-goog-hash"] == f"crc32c={crc32c_of_bytes(p.body)}"
    assert [len(p.body) for p in parts] == [PART, PART, PART, 4321]
    (done,) = [r for r in gcs_recorder.seen("POST", "uploadId")]
    numbers = re.findall(rb"<PartNumber>(\d+)</PartNumber>", done.body)
    etags = re.findall(rb"<ETag>([^<]+)</ETag>", done.body)
    assert numbers == [b"1", b"2", b"3", b"4"]
    assert etags == [f'"{crc32c_of_bytes(p.body)}"'.encode() for p in parts]

    assert gcs_recorder.objects["run/step 5/shard-0.safetensors"] == data
    assert info.crc32c == crc32c_of_bytes(data)  # computed while reading, in order
    assert sorted(seen) == sorted([PART, PART, PART, 4321])
    backend.close()


def _upload_id(recorder: GcsRecorder) -> str:
    return recorder.seen("PUT", "partNumber")[0].query["uploadId"]


def test_a_part_failing_once_is_sent_again(
    gcs_recorder: GcsRecorder, src: tuple[Path, bytes]
) -> None:
    path, data = src
    backend = _backend(gcs_recorder)
    gcs_recorder.fail("PUT", "partNumber=3", status=503)
    backend.put_file("w.bin", path)
    tries = gcs_recorder.seen("PUT", "partNumber")
    assert sorted(int(p.query["partNumber"]) for p in tries) == [1, 2, 3, 3, 4]
    assert gcs_recorder.objects["run/w.bin"] == data
    backend.close()


def test_a_refused_part_aborts_the_upload(
    gcs_recorder: GcsRecorder, src: tuple[Path, bytes]
) -> None:
    path, _ = src
    backend = _backend(gcs_recorder)
    body = "<Error><Code>AccessDenied</Code><Message>Access denied.</Message></Error>"
    gcs_recorder.fail("PUT", "partNumber=2", status=403, body=body)
    with pytest.raises(PermanentError) as err:
        backend.put_file("w.bin", path)
    assert "multipart upload gs://b/run/w.bin" in str(err.value)
    assert "AccessDenied" in str(err.value)
    assert "roles/storage.objectUser" in str(err.value)
    assert len(gcs_recorder.seen("DELETE", "uploadId")) == 1
    assert gcs_recorder.seen("POST", "uploadId=") == []  # never completed
    assert gcs_recorder.uploads == {} and gcs_recorder.objects == {}
    backend.close()


def test_a_damaged_part_is_a_retryable_mismatch(
    gcs_recorder: GcsRecorder, src: tuple[Path, bytes]
) -> None:
    path, _ = src
    backend = _backend(gcs_recorder)
    body = "<Error><Code>BadDigest</Code><Message>CRC32C mismatch</Message></Error>"
    gcs_recorder.fail("PUT", "partNumber=1", status=400, body=body)
    with pytest.raises(ChecksumMismatch) as err:
        backend.put_file("w.bin", path)
    assert isinstance(err.value, TransientError)
    assert len(gcs_recorder.seen("DELETE", "uploadId")) == 1
    assert gcs_recorder.objects == {}
    backend.close()


def test_cancel_aborts_before_anything_is_visible(
    gcs_recorder: GcsRecorder, src: tuple[Path, bytes]
) -> None:
    path, _ = src
    backend = _backend(gcs_recorder)

    def cancel(n: int) -> None:
        raise Cancelled("drain")

    with pytest.raises(Cancelled):
        backend.put_file("w.bin", path, progress=cancel)
    assert len(gcs_recorder.seen("DELETE", "uploadId")) == 1
    assert gcs_recorder.uploads == {} and gcs_recorder.objects == {}
    backend.close()


def test_missing_bucket_on_initiate_is_permanent(
    gcs_recorder: GcsRecorder, src: tuple[Path, bytes]
) -> None:
    path, _ = src
    backend = _backend(gcs_recorder)
    body = (
        "<Error><Code>NoSuchBucket</Code><Message>The specified bucket does not exist."
        "</Message></Error>"
    )
    gcs_recorder.fail("POST", "uploads", status=404, body=body)
    with pytest.raises(PermanentError, match="bucket 'b' does not exist"):
        backend.put_file("w.bin", path)
    backend.close()


def test_parts_in_flight_are_bounded_for_the_whole_backend(
    gcs_recorder: GcsRecorder, tmp_path: Path
) -> None:
    files = {}
    for i in range(2):
        files[f"shard-{i}.bin"] = data = os.urandom(4 * PART)
        (tmp_path / f"shard-{i}.bin").write_bytes(data)
    backend = _backend(gcs_recorder, part_concurrency=3)
    gcs_recorder.part_delay = 0.05  # each part takes a while: the two uploads overlap
    with cf.ThreadPoolExecutor(2) as pool:
        list(pool.map(lambda n: backend.put_file(n, tmp_path / n), files))
    assert gcs_recorder.max_uploads_in_flight == 2  # the two uploads did overlap
    assert 1 < gcs_recorder.max_parts_in_flight <= 3  # 3 for both files together, not 3 each
    assert {n: gcs_recorder.objects[f"run/{n}"] for n in files} == files
    backend.close()


def test_a_failed_part_fails_only_its_own_file(gcs_recorder: GcsRecorder, tmp_path: Path) -> None:
    for i in range(2):
        (tmp_path / f"shard-{i}.bin").write_bytes(os.urandom(4 * PART))
    backend = _backend(gcs_recorder, part_concurrency=2)
    gcs_recorder.part_delay = 0.05
    denied = "<Error><Code>AccessDenied</Code><Message>Access denied.</Message></Error>"
    gcs_recorder.fail("PUT", "partNumber=2&", status=403, body=denied)  # the first part 2

    def put(name: str) -> object:
        try:
            return backend.put_file(name, tmp_path / name)
        except PermanentError as e:
            return e

    names = ["shard-0.bin", "shard-1.bin"]
    with cf.ThreadPoolExecutor(2) as pool:
        results = dict(zip(names, pool.map(put, names), strict=True))
    failed = [n for n, r in results.items() if isinstance(r, PermanentError)]
    assert len(failed) == 1  # whichever sent a part 2 first; the other is whole
    (whole,) = set(results) - set(failed)
    assert gcs_recorder.objects == {f"run/{whole}": (tmp_path / whole).read_bytes()}
    assert gcs_recorder.uploads == {}  # the failed one was aborted
    backend.close()


def test_threshold_decides_the_path(gcs_recorder: GcsRecorder, tmp_path: Path) -> None:
    path = tmp_path / "f"
    path.write_bytes(os.urandom(PART + 1))
    below = gcs_backend(
        gcs_recorder.url, "b", "run", chunk_size_bytes=PART, xml_multipart_threshold_bytes=PART + 2
    )
    below.put_file("below", path)
    assert gcs_recorder.seen("POST", "uploads") == []
    # emulator mode (a host given) leaves the XML path off unless a threshold is set
    auto = gcs_backend(gcs_recorder.url, "b", "run", chunk_size_bytes=PART)
    auto.put_file("auto", path)
    assert gcs_recorder.seen("POST", "uploads") == []
    assert len(gcs_recorder.seen("POST", "uploadType=resumable")) == 2
    below.close()
    auto.close()


class _CountedBuffers(PartBuffers):
    """Part buffers that count what was taken and given back."""

    def __init__(self, keep: int) -> None:
        super().__init__(keep)
        self.taken = self.given = 0

    def take(self, size: int) -> bytearray:
        self.taken += 1
        return super().take(size)

    def give(self, buf: bytearray) -> None:
        self.given += 1
        super().give(buf)


def _upload(
    http: requests.Session, recorder: GcsRecorder, f: io.BytesIO, size: int, buffers: PartBuffers
) -> str:
    with cf.ThreadPoolExecutor(2) as pool, cf.ThreadPoolExecutor(1) as reader:
        return upload_xml_multipart(
            http, recorder.url, "b", "run/model.pt", f, size,
            part_size=PART, budget=Budget(2), buffers=buffers, pool=pool, reader=reader,
            headers={},
        )  # fmt: skip


def test_a_file_shorter_than_its_size_is_transient_and_aborted(gcs_recorder: GcsRecorder) -> None:
    """The file shrank after its size was taken (the trainer rewrote it): the upload stops
    with a TransientError, is aborted, and every part's buffer goes back to the pool."""
    buffers = _CountedBuffers(keep=2)
    with pytest.raises(TransientError, match="shrank"):
        _upload(requests.Session(), gcs_recorder, io.BytesIO(os.urandom(PART + 1000)), 2 * PART,
                buffers)  # fmt: skip
    assert len(gcs_recorder.seen("DELETE", "uploadId")) == 1
    assert gcs_recorder.uploads == {} and gcs_recorder.objects == {}
    assert buffers.taken == buffers.given == 2  # the sent part's and the short one's


def test_a_part_sent_again_after_a_token_refresh_carries_all_its_bytes(
    gcs_recorder: GcsRecorder,
) -> None:
    """google-auth's session answers a 401 by refreshing the token and sending the same
    request again itself: the part must go up whole the second time too."""
    tokens = iter(["second", "third"])
    creds = Credentials(  # type: ignore[no-untyped-call]
        "first",
        refresh_handler=lambda request, scopes: (next(tokens), datetime.now(UTC).replace(
            tzinfo=None) + timedelta(hours=1)),
    )  # fmt: skip
    http = AuthorizedSession(creds)  # type: ignore[no-untyped-call]
    http.mount("http://", BlockwiseAdapter())
    gcs_recorder.fail("PUT", "partNumber=1&", 401, body='{"error": {"code": 401}}')
    data = os.urandom(PART + 1000)
    crc = _upload(http, gcs_recorder, io.BytesIO(data), len(data), _CountedBuffers(keep=2))
    first = [r for r in gcs_recorder.seen("PUT", "partNumber=1&")]
    assert [r.headers["authorization"] for r in first] == ["Bearer first", "Bearer second"]
    assert len(first[1].body) == PART and first[1].headers["content-length"] == str(PART)
    assert gcs_recorder.objects["run/model.pt"] == data and crc == crc32c_of_bytes(data)


def test_the_sink_look_alike_checks_what_it_does_not_keep(
    gcs_recorder: GcsRecorder, src: tuple[Path, bytes]
) -> None:
    """bench.memory's GCS look-alike (sink mode) keeps no part bytes, yet the object it
    lists has the file's size and CRC32C, so the backend's own check of the stored object
    still decides whether the upload counts."""
    path, data = src
    gcs_recorder.sink = True
    backend = _backend(gcs_recorder)
    info = backend.put_file("big", path)
    assert gcs_recorder.objects["run/big"] == Sunk(len(data), Sunk.of(data).crc)
    assert gcs_recorder.resource("run/big")["crc32c"] == crc32c_of_bytes(data) == info.crc32c
    assert [len(r.body) for r in gcs_recorder.seen("PUT", "partNumber")] == [0, 0, 0, 0]
    backend.put_bytes("small", b"{}")  # a manifest: kept whole
    assert gcs_recorder.objects["run/small"] == b"{}"
    backend.close()


def test_part_size_fits_ten_thousand_parts() -> None:
    assert part_size_for(100 * MiB, 64 * MiB) == 64 * MiB
    assert part_size_for(100 * MiB, 1 * MiB) == 5 * MiB  # the XML API's minimum part
    huge = 5 * 1024**4  # 5 TiB, GCS's largest object
    assert -(-huge // part_size_for(huge, 64 * MiB)) <= 10_000


def test_stale_multipart_uploads_are_aborted_by_the_store_clock(gcs_recorder: GcsRecorder) -> None:
    backend = _backend(gcs_recorder)
    hour = 3600.0
    now = time.time()
    gcs_recorder.uploads.update(
        {"old": ("run/a.bin", {}), "new": ("run/b.bin", {}), "other": ("elsewhere/c.bin", {})}
    )
    gcs_recorder.initiated.update(
        {"old": now - 30 * hour, "new": now - hour, "other": now - 99 * hour}
    )
    gcs_recorder.clock_offset = -10 * hour  # the store's clock is behind ours: "old" is 20 h old
    assert backend.cleanup_stale(24 * hour) == 0
    gcs_recorder.clock_offset = 0.0
    assert backend.cleanup_stale(24 * hour) == 1
    assert set(gcs_recorder.uploads) == {"new", "other"}  # another prefix is never touched
    gcs_recorder.clock_offset = 48 * hour  # the store's clock is ahead: "new" is 49 h old
    assert backend.cleanup_stale(24 * hour) == 1
    assert set(gcs_recorder.uploads) == {"other"}
    backend.close()
    plain = gcs_backend(gcs_recorder.url, "b", "run")  # XML path off: nothing to look for
    sent = len(gcs_recorder.requests)
    assert plain.cleanup_stale(0) == 0
    assert len(gcs_recorder.requests) == sent
    plain.close()
