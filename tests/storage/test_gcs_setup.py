"""Start-up: the bucket's region against ``allowed_regions``, missing buckets, access,
credentials, and ``STORAGE_EMULATOR_HOST`` through the registry."""

from __future__ import annotations

import json
import socket
from pathlib import Path

import pydantic
import pytest
from google.cloud.storage.retry import DEFAULT_RETRY

from sidecar.config import DestinationConfig
from sidecar.storage import gcs
from sidecar.storage.base import DestinationRejected, PermanentError
from sidecar.storage.gcs import GcsBackend
from sidecar.storage.options import GcsOptions
from sidecar.storage.registry import open_backend
from tests.servers.gcs import GcsRecorder, GcsServer, gcs_backend


def test_bucket_outside_allowed_regions_is_rejected(fake_gcs_server: GcsServer) -> None:
    bucket = fake_gcs_server.new_bucket()  # fake-gcs-server puts buckets in US-CENTRAL1
    rejected = GcsBackend(
        bucket, "run", allowed_regions=["europe-west4", "eu"], emulator_host=fake_gcs_server.url
    )
    with pytest.raises(DestinationRejected) as err:
        rejected.check()
    msg = str(err.value)
    assert f"gs://{bucket}" in msg and "US-CENTRAL1" in msg and "europe-west4" in msg
    assert isinstance(err.value, PermanentError)  # the daemon exits 2 with this line
    allowed = GcsBackend(
        bucket, "run", allowed_regions=["us-central1"], emulator_host=fake_gcs_server.url
    )
    allowed.check()
    unrestricted = GcsBackend(bucket, "run", emulator_host=fake_gcs_server.url)
    unrestricted.check()
    for b in (rejected, allowed, unrestricted):
        b.close()


def test_multi_region_bucket_is_not_a_region(gcs_emulator: GcsServer) -> None:
    bucket = gcs_emulator.new_bucket()  # gcp-storage-emulator: location US, multi-region
    backend = GcsBackend(
        bucket, "", allowed_regions=["us-central1"], emulator_host=gcs_emulator.url
    )
    with pytest.raises(DestinationRejected, match=r"is in US \(multi-region\)"):
        backend.check()
    backend.close()


@pytest.mark.parametrize("emulator", ["gcs_emulator", "fake_gcs_server"])
def test_missing_bucket_is_permanent_with_the_fix(
    emulator: str, request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    server: GcsServer = request.getfixturevalue(emulator)
    backend = gcs_backend(server.url, "no-such-bucket", chunk_size_bytes=256 * 1024)
    with pytest.raises(PermanentError) as err:
        backend.check()
    assert "bucket 'no-such-bucket' does not exist" in str(err.value)
    assert "gcloud storage buckets create gs://no-such-bucket" in str(err.value)
    big = tmp_path / "big"
    big.write_bytes(b"x" * 600_000)
    with pytest.raises(PermanentError, match="does not exist"):
        backend.put_file("big", big)  # a resumable session
    with pytest.raises(PermanentError, match="does not exist"):
        backend.put_bytes("m.json", b"{}")  # a single request
    backend.close()


def test_bucket_metadata_denied(gcs_recorder: GcsRecorder) -> None:
    denied = '{"error": {"code": 403, "message": "no storage.buckets.get"}}'
    regions = GcsBackend(
        "b", "run", allowed_regions=["europe-west4"], emulator_host=gcs_recorder.url
    )
    gcs_recorder.fail("GET", r"^/storage/v1/b/b\?", status=403, body=denied)
    with pytest.raises(PermanentError, match=r"storage\.buckets\.get"):
        regions.check()  # the region cannot be checked without it
    plain = GcsBackend("b", "run", emulator_host=gcs_recorder.url)
    gcs_recorder.fail("GET", r"^/storage/v1/b/b\?", status=403, body=denied)
    plain.check()  # falls back to a listing, which works
    assert len(gcs_recorder.seen("GET", r"^/storage/v1/b/b/o\?")) == 1
    gcs_recorder.fail("GET", r"^/storage/v1/b/b\?", status=403, body=denied)
    gcs_recorder.fail("GET", r"^/storage/v1/b/b/o\?", status=403, body=denied)
    with pytest.raises(PermanentError, match=r"roles/storage\.objectUser"):
        plain.check()
    regions.check()  # bucket readable again, in EUROPE-WEST4: allowed
    regions.close()
    plain.close()


def test_unreachable_endpoint_at_start_is_permanent(monkeypatch: pytest.MonkeyPatch) -> None:
    # check() retries connection failures for 10 s (a network coming up); 0.5 s here
    monkeypatch.setattr(gcs, "_CHECK_RETRY", DEFAULT_RETRY.with_timeout(0.5))
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # nothing listens once closed
    backend = GcsBackend("b", "", emulator_host=f"127.0.0.1:{port}")
    with pytest.raises(PermanentError, match="cannot reach"):
        backend.check()
    backend.close()


def test_storage_emulator_host_is_honoured_by_the_registry(
    fake_gcs_server: GcsServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    bucket = fake_gcs_server.new_bucket()
    monkeypatch.setenv("STORAGE_EMULATOR_HOST", fake_gcs_server.url.removeprefix("http://"))
    backend = open_backend(DestinationConfig(url=f"gs://{bucket}/jobs/run-3"))
    assert isinstance(backend, GcsBackend) and backend.url == f"gs://{bucket}/jobs/run-3"
    backend.check()
    backend.put_bytes("LATEST", b"step-9")
    whole = gcs_backend(fake_gcs_server.url, bucket, "")
    assert [o.key for o in whole.list()] == ["jobs/run-3/LATEST"]
    backend.close()
    whole.close()


def test_unusable_credentials_file_names_the_option_not_the_key(tmp_path: Path) -> None:
    key = tmp_path / "sa.json"
    secret = "-----BEGIN PRIVATE KEY-----\nTOP-SECRET-MATERIAL\n-----END PRIVATE KEY-----\n"
    key.write_text(
        json.dumps(
            {
                "type": "service_account",
                "project_id": "p",
                "private_key_id": "abc",
                "private_key": secret,
                "client_email": "sidecar@p.iam.gserviceaccount.com",
                "token_uri": "https://oauth2.googleapis.com/token",
            }
        )
    )
    for path in (key, tmp_path / "missing.json"):
        with pytest.raises(PermanentError) as err:
            GcsBackend("b", "", GcsOptions(credentials_file=str(path)))
        assert "destination.gcs.credentials_file" in str(err.value)
        assert "TOP-SECRET" not in str(err.value) and err.value.__cause__ is None


def test_missing_application_default_credentials(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("GOOGLE_APPLICATION_CREDENTIALS", str(tmp_path / "none.json"))
    with pytest.raises(PermanentError, match="Application Default Credentials"):
        GcsBackend("b", "")


def test_chunk_size_must_suit_gcs() -> None:
    with pytest.raises(pydantic.ValidationError, match="multiple of 256 KiB"):
        GcsOptions(chunk_size_bytes=1_000_000)
    with pytest.raises(pydantic.ValidationError, match="kms_key_name"):
        GcsOptions(kms_key_name="my-key")
