"""The resumable protocol at the HTTP level, against the recording look-alike: what each
request carries, how a session survives failures, and which errors reach the caller."""

from __future__ import annotations

import contextlib
import errno
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from sidecar.storage import gcs, gcs_resumable
from sidecar.storage.base import (
    Cancelled,
    ChecksumMismatch,
    PermanentError,
    StorageError,
    TransientError,
)
from sidecar.storage.checksum import crc32c_of_bytes
from tests.servers.gcs import GcsRecorder, gcs_backend

CHUNK = 256 * 1024
MiB = 1024 * 1024


@pytest.fixture(autouse=True)
def _no_pauses(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(gcs_resumable, "RETRY_PAUSES", (0.0, 0.0, 0.0))


@pytest.fixture
def src(tmp_path: Path) -> Iterator[tuple[Path, bytes]]:
    data = os.urandom(2 * CHUNK + 100)
    path = tmp_path / "model.pt"
    path.write_bytes(data)
    yield path, data


def test_chunks_carry_ranges_and_the_final_one_the_crc32c(
    gcs_recorder: GcsRecorder, src: tuple[Path, bytes]
) -> None:
    path, data = src
    backend = gcs_backend(gcs_recorder.url, "b", "run", chunk_size_bytes=CHUNK)
    info = backend.put_file("model.pt", path)
    start = gcs_recorder.seen("POST", "uploadType")
    assert len(start) == 1 and start[0].headers["x-upload-content-length"] == str(len(data))
    puts = gcs_recorder.seen("PUT", "upload_id")
    total = len(data)
    assert [p.headers["content-range"] for p in puts] == [
        f"bytes 0-{CHUNK - 1}/{total}",
        f"bytes {CHUNK}-{2 * CHUNK - 1}/{total}",
        f"bytes {2 * CHUNK}-{total - 1}/{total}",
    ]
    assert [p.headers.get("x-goog-hash") for p in puts] == [
        None, None, f"crc32c={crc32c_of_bytes(data)}",
    ]  # fmt: skip
    assert "authorization" not in puts[0].headers  # emulator mode: anonymous
    assert gcs_recorder.objects["run/model.pt"] == data
    assert info.crc32c == crc32c_of_bytes(data)
    backend.close()


def test_one_streamed_request_then_the_last_piece_with_the_crc32c(
    gcs_recorder: GcsRecorder, tmp_path: Path
) -> None:
    data = os.urandom(9 * MiB + 100)
    path = tmp_path / "model.pt"
    path.write_bytes(data)
    backend = gcs_backend(gcs_recorder.url, "b", "run")  # default chunk_size_bytes
    seen: list[int] = []
    backend.put_file("model.pt", path, progress=seen.append)
    puts = gcs_recorder.seen("PUT", "upload_id")
    total = len(data)
    assert [(p.headers["content-range"], p.headers.get("x-goog-hash")) for p in puts] == [
        (f"bytes 0-{9 * MiB - 1}/{total}", None),
        (f"bytes {9 * MiB}-{total - 1}/{total}", f"crc32c={crc32c_of_bytes(data)}"),
    ]
    assert sum(seen) == total and max(seen) <= MiB  # reported as read, a block at a time
    assert seen[-1] == 100  # the last piece, announced before it is sent
    assert gcs_recorder.objects["run/model.pt"] == data
    backend.close()


def test_a_request_cut_midway_goes_on_from_what_the_session_kept(
    gcs_recorder: GcsRecorder, tmp_path: Path
) -> None:
    data = os.urandom(9 * MiB + 7)
    path = tmp_path / "model.pt"
    path.write_bytes(data)
    backend = gcs_backend(gcs_recorder.url, "b", "run")
    gcs_recorder.fail("PUT", "upload_id=", keep=MiB + 1000)  # kept 1 MiB + 1000, then cut
    seen: list[int] = []
    info = backend.put_file("model.pt", path, progress=seen.append)
    ranges = [p.headers["content-range"] for p in gcs_recorder.seen("PUT", "upload_id")]
    total = len(data)
    assert ranges == [
        f"bytes 0-{9 * MiB - 1}/{total}",  # cut after 1 MiB + 1000 bytes
        f"bytes */{total}",  # how much do you hold?
        f"bytes {MiB + 1000}-{9 * MiB - 1}/{total}",  # only the rest, read again
        f"bytes {9 * MiB}-{total - 1}/{total}",
    ]
    assert sum(seen) == total  # bytes sent twice are reported once
    assert gcs_recorder.objects["run/model.pt"] == data  # and counted once in the CRC32C
    assert info.crc32c == crc32c_of_bytes(data)
    backend.close()


def test_cancelled_midway_through_a_request_stops_it_and_leaves_no_object(
    gcs_recorder: GcsRecorder, tmp_path: Path
) -> None:
    path = tmp_path / "model.pt"
    path.write_bytes(os.urandom(64 * MiB))
    backend = gcs_backend(gcs_recorder.url, "b", "run")
    sent: list[int] = []

    def progress(n: int) -> None:
        sent.append(n)
        if sum(sent) >= 2 * MiB:
            raise Cancelled("drain chose another checkpoint")

    with pytest.raises(Cancelled):
        backend.put_file("model.pt", path, progress=progress)
    assert sum(sent) == 2 * MiB  # stopped reading at once, not at the end of the request
    assert len(gcs_recorder.seen("DELETE", "upload_id")) == 1
    assert gcs_recorder.objects == {} and gcs_recorder.sessions == {}
    backend.close()


def test_a_file_shrinking_midway_is_transient_and_leaves_no_object(
    gcs_recorder: GcsRecorder, tmp_path: Path
) -> None:
    path = tmp_path / "model.pt"
    path.write_bytes(os.urandom(16 * MiB))
    backend = gcs_backend(gcs_recorder.url, "b", "run")

    def progress(n: int) -> None:
        os.truncate(path, 3 * MiB)  # the trainer rewrites it while it is sent

    with pytest.raises(TransientError, match="shrank"):
        backend.put_file("model.pt", path, progress=progress)
    assert len(gcs_recorder.seen("DELETE", "upload_id")) == 1
    assert gcs_recorder.objects == {}
    backend.close()


def test_a_file_that_cannot_be_read_is_a_local_error_not_the_stores(
    gcs_recorder: GcsRecorder, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An I/O error reading the file midway (EIO, ESTALE on NFS) is raised as the OSError it
    is, at once: not retried as a broken connection and reported as a GCS failure."""
    path = tmp_path / "model.pt"
    path.write_bytes(os.urandom(8 * MiB))

    @contextlib.contextmanager
    def failing(p: Path) -> Iterator[Any]:
        with open(p, "rb") as f:
            read = f.read

            def broken(n: int | None = -1) -> bytes:
                if f.tell() >= 2 * MiB:
                    raise OSError(errno.EIO, "Input/output error", str(p))
                return read(n)

            f.read = broken  # type: ignore[method-assign]
            yield f

    monkeypatch.setattr(gcs, "open_source", failing)
    backend = gcs_backend(gcs_recorder.url, "b", "run")
    with pytest.raises(OSError) as err:
        backend.put_file("model.pt", path)
    assert err.value.errno == errno.EIO and not isinstance(err.value, StorageError)
    # The request cut by the error never completed; no status query or retry followed it.
    assert gcs_recorder.seen("PUT", "upload_id") == [], "retried as a network error"
    assert len(gcs_recorder.seen("DELETE", "upload_id")) == 1
    assert gcs_recorder.objects == {}
    backend.close()


@pytest.mark.parametrize(("status", "drop"), [(503, False), (429, False), (0, True)])
def test_a_failed_chunk_resumes_where_the_session_stands(
    gcs_recorder: GcsRecorder, src: tuple[Path, bytes], status: int, drop: bool
) -> None:
    path, data = src
    backend = gcs_backend(gcs_recorder.url, "b", "run", chunk_size_bytes=CHUNK)
    backend.put_file("warm.pt", path)  # a clean run, for comparison
    clean = len(gcs_recorder.seen("PUT", "upload_id"))
    gcs_recorder.requests.clear()
    gcs_recorder.fail("PUT", "upload_id=", status, drop=drop)  # the first chunk fails once
    info = backend.put_file("model.pt", path)
    puts = gcs_recorder.seen("PUT", "upload_id")
    status_queries = [p for p in puts if p.headers["content-range"] == f"bytes */{len(data)}"]
    assert len(status_queries) == 1  # asked the session how much it holds, then went on
    assert len(puts) == clean + 2  # the failed chunk, the query, the chunk again
    assert gcs_recorder.objects["run/model.pt"] == data
    assert info.crc32c == crc32c_of_bytes(data)
    backend.close()


def test_a_chunk_failing_every_time_is_transient_and_cancels(
    gcs_recorder: GcsRecorder, src: tuple[Path, bytes]
) -> None:
    path, _ = src
    backend = gcs_backend(gcs_recorder.url, "b", "run", chunk_size_bytes=CHUNK)
    gcs_recorder.fail("PUT", "upload_id=", status=503, times=100)
    with pytest.raises(TransientError, match=r"gs://b/run/model\.pt") as err:
        backend.put_file("model.pt", path)
    assert not isinstance(err.value, PermanentError)
    assert len(gcs_recorder.seen("DELETE", "upload_id")) == 1  # the session is cancelled
    assert "upload_id" not in str(err.value)  # the session URI is a capability: never shown
    assert gcs_recorder.objects == {}
    backend.close()


def test_store_rejecting_the_final_crc32c_is_a_retryable_mismatch(
    gcs_recorder: GcsRecorder, src: tuple[Path, bytes]
) -> None:
    path, _ = src
    backend = gcs_backend(gcs_recorder.url, "b", "run", chunk_size_bytes=CHUNK)
    body = '{"error": {"code": 400, "message": "Provided CRC32C \\"AAAAAA==\\" doesn\'t match"}}'
    gcs_recorder.fail("PUT", "upload_id=", status=400, body=body)
    with pytest.raises(ChecksumMismatch) as err:
        backend.put_file("model.pt", path)
    assert isinstance(err.value, TransientError)
    assert gcs_recorder.objects == {}
    backend.close()


def test_access_denied_names_bucket_operation_and_fix(
    gcs_recorder: GcsRecorder, src: tuple[Path, bytes]
) -> None:
    path, _ = src
    backend = gcs_backend(gcs_recorder.url, "b", "run", chunk_size_bytes=CHUNK)
    denied = (
        '{"error": {"code": 403, "message": "sidecar@p.iam.gserviceaccount.com does not have '
        'storage.objects.create access to the Google Cloud Storage object."}}'
    )
    gcs_recorder.fail("POST", "uploadType=resumable", status=403, body=denied)
    with pytest.raises(PermanentError) as err:
        backend.put_file("model.pt", path)
    msg = str(err.value)
    assert "upload gs://b/run/model.pt" in msg
    assert "storage.objects.create" in msg  # the server's reason
    assert "roles/storage.objectUser" in msg  # the fix
    assert "\n" not in msg
    gcs_recorder.fail("POST", "uploadType=multipart", status=403, body=denied)
    with pytest.raises(PermanentError, match="access denied"):
        backend.put_bytes("m.json", b"{}")
    backend.close()


def test_server_errors_on_small_writes_are_transient(gcs_recorder: GcsRecorder) -> None:
    backend = gcs_backend(gcs_recorder.url, "b", "run")
    gcs_recorder.fail("POST", "uploadType=multipart", status=503)
    with pytest.raises(TransientError):
        backend.put_bytes("m.json", b"{}")
    backend.put_bytes("m.json", b"{}")
    assert gcs_recorder.objects == {"run/m.json": b"{}"}
    backend.close()
