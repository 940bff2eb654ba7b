"""Storage class and server-side encryption reach the store; stale multipart uploads are
aborted by the store's clock; the standard AWS environment configures the backend."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from pydantic import ValidationError

from sidecar.config import DestinationConfig
from sidecar.storage.base import StorageError
from sidecar.storage.options import S3Options
from sidecar.storage.registry import open_backend
from sidecar.storage.s3 import S3Backend
from tests.conformance.test_s3 import MiB, s3_backend
from tests.servers.seaweedfs import S3Proxy, S3Server, new_bucket


def test_storage_class_and_sse_reach_the_store(s3_env: S3Server, tmp_path: Path) -> None:
    bucket = new_bucket(s3_env)
    backend = s3_backend(s3_env, bucket, "p", storage_class="STANDARD_IA", sse="AES256")
    small = tmp_path / "small"
    small.write_bytes(b"x" * 1000)
    big = tmp_path / "big"
    big.write_bytes(os.urandom(2 * 5 * MiB))
    backend.put_file("small", small)
    backend.put_file("big", big)
    backend.copy("big", "big-copy")
    backend.put_bytes("m.json", b"{}", create_only=True)
    raw = s3_env.client()
    for key in ("small", "big", "big-copy", "m.json"):
        head = raw.head_object(Bucket=bucket, Key=f"p/{key}")
        assert head.get("StorageClass") == "STANDARD_IA", key
        assert head.get("ServerSideEncryption") == "AES256", key
    backend.close()


def test_kms_settings_are_sent(
    s3_env: S3Server, s3_proxy: S3Proxy, monkeypatch: pytest.MonkeyPatch
) -> None:
    # SeaweedFS without a KMS provider answers aws:kms writes with InternalError, so the
    # test shows the request the store receives rather than the stored object.
    monkeypatch.setenv("AWS_MAX_ATTEMPTS", "1")
    backend = s3_backend(
        s3_env,
        new_bucket(s3_env),
        endpoint_url=s3_proxy.endpoint_url,
        sse="aws:kms",
        sse_kms_key_id="alias/checkpoints",
        bucket_key_enabled=True,
    )
    with pytest.raises(StorageError):
        backend.put_bytes("m.json", b"{}")
    sent = s3_proxy.requests[-1].headers
    assert sent["x-amz-server-side-encryption"] == "aws:kms"
    assert sent["x-amz-server-side-encryption-aws-kms-key-id"] == "alias/checkpoints"
    assert sent["x-amz-server-side-encryption-bucket-key-enabled"] == "true"
    backend.close()


def test_kms_key_without_kms_is_a_config_error() -> None:
    with pytest.raises(ValidationError, match="aws:kms"):
        S3Options(sse="AES256", sse_kms_key_id="k")


def test_stale_multipart_uploads_are_aborted(s3_env: S3Server) -> None:
    bucket = new_bucket(s3_env)
    raw = s3_env.client()
    ours = raw.create_multipart_upload(Bucket=bucket, Key="run/node-0/ckpt/a.pt")
    other = raw.create_multipart_upload(Bucket=bucket, Key="elsewhere/b.pt")
    backend = s3_backend(s3_env, bucket, "run/node-0")
    assert backend.cleanup_stale(3600) == 0  # too young by the store's clock
    assert backend.cleanup_stale(0) == 1
    left = {u["UploadId"] for u in raw.list_multipart_uploads(Bucket=bucket).get("Uploads", [])}
    assert left == {other["UploadId"]}
    assert ours["UploadId"] not in left
    backend.close()


def test_standard_aws_environment_configures_the_backend(
    s3_env: S3Server, monkeypatch: pytest.MonkeyPatch
) -> None:
    # No destination.s3 settings at all: endpoint and region come from the environment.
    monkeypatch.setenv("AWS_ENDPOINT_URL_S3", s3_env.endpoint_url)
    monkeypatch.setenv("AWS_REGION", s3_env.region)
    bucket = new_bucket(s3_env)
    backend = open_backend(DestinationConfig(url=f"s3://{bucket}/jobs/42"))
    assert isinstance(backend, S3Backend)
    assert backend.url == f"s3://{bucket}/jobs/42"
    backend.check()
    backend.put_bytes("x", b"1")
    assert s3_env.client().get_object(Bucket=bucket, Key="jobs/42/x")["Body"].read() == b"1"
    assert [o.key for o in backend.list()] == ["x"]
    backend.close()


def test_named_profile_from_shared_files(
    s3_env: S3Server, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.delenv("AWS_ACCESS_KEY_ID")
    monkeypatch.delenv("AWS_SECRET_ACCESS_KEY")
    creds = tmp_path / "credentials"
    creds.write_text(
        f"[ckpt]\naws_access_key_id = {s3_env.access_key}\n"
        f"aws_secret_access_key = {s3_env.secret_key}\n"
    )
    config = tmp_path / "config"
    config.write_text(
        f"[profile ckpt]\nregion = {s3_env.region}\nendpoint_url = {s3_env.endpoint_url}\n"
    )
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(creds))
    monkeypatch.setenv("AWS_CONFIG_FILE", str(config))
    bucket = new_bucket(s3_env)
    via_env = {"AWS_PROFILE": "ckpt"}
    for name, value in via_env.items():
        monkeypatch.setenv(name, value)
    backend = open_backend(DestinationConfig(url=f"s3://{bucket}"))
    backend.check()
    backend.put_bytes("a", b"a")
    backend.close()
    monkeypatch.delenv("AWS_PROFILE")
    named = S3Backend(bucket, "", S3Options(profile="ckpt"))
    assert named.get_bytes("a") == b"a"
    named.close()
