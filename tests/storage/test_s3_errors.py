"""Permanent errors name the bucket, the operation and the fix; transient ones are retried;
``allowed_regions`` refuses a bucket elsewhere; credentials never appear in a message."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from sidecar.storage.base import DestinationRejected, PermanentError, TransientError
from tests.conformance.test_s3 import s3_backend
from tests.servers.seaweedfs import S3Proxy, S3Server, new_bucket


@pytest.fixture(autouse=True)
def _one_attempt(s3_env: S3Server, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AWS_MAX_ATTEMPTS", "1")  # no boto3 retries: see our mapping


def test_missing_bucket(s3_env: S3Server, tmp_path: Path) -> None:
    backend = s3_backend(s3_env, "no-such-bucket-here")
    with pytest.raises(PermanentError) as err:
        backend.check()
    msg = str(err.value)
    assert "no-such-bucket-here" in msg and "ListObjectsV2" in msg
    assert "NoSuchBucket" in msg and "create it or fix destination.url" in msg
    with pytest.raises(PermanentError, match="PutObject on bucket 'no-such-bucket-here'"):
        backend.put_bytes("m.json", b"{}")
    with pytest.raises(PermanentError, match="GetObject on bucket 'no-such-bucket-here'"):
        backend.get_bytes("m.json")
    backend.close()


def test_bad_credentials(s3_env: S3Server, monkeypatch: pytest.MonkeyPatch) -> None:
    bucket = new_bucket(s3_env)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "wrong-secret-value")
    backend = s3_backend(s3_env, bucket)
    with pytest.raises(PermanentError) as err:
        backend.check()
    msg = str(err.value)
    assert bucket in msg and "ListObjectsV2" in msg
    assert "SignatureDoesNotMatch" in msg and "AWS_SECRET_ACCESS_KEY" in msg
    assert "wrong-secret-value" not in msg
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "unknown-key-id")
    backend = s3_backend(s3_env, bucket)
    with pytest.raises(PermanentError, match="InvalidAccessKeyId"):
        backend.put_bytes("x", b"x")
    backend.close()


def test_unreachable_endpoint(s3_env: S3Server) -> None:
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    backend = s3_backend(s3_env, "some-bucket", endpoint_url=f"http://127.0.0.1:{port}")
    with pytest.raises(PermanentError) as err:
        backend.check()
    msg = str(err.value)
    assert "some-bucket" in msg and "cannot reach the endpoint" in msg
    assert "endpoint_url" in msg and "AWS_ENDPOINT_URL_S3" in msg
    with pytest.raises(TransientError):  # once running, an outage is retried
        backend.put_bytes("x", b"x")
    backend.close()


def test_tls_failure_at_start_is_permanent(s3_env: S3Server) -> None:
    """TLS that cannot work (here: https to a plain-HTTP port; a wrong CA bundle or a
    self-signed endpoint alike) is a setting to fix, reported at start, not an outage
    retried for ever with /readyz green."""
    plain = s3_env.endpoint_url.rsplit(":", 1)[1]
    backend = s3_backend(s3_env, "some-bucket", endpoint_url=f"https://127.0.0.1:{plain}")
    with pytest.raises(PermanentError) as err:
        backend.check()
    msg = str(err.value)
    assert "TLS with the endpoint failed" in msg and "AWS_CA_BUNDLE" in msg
    with pytest.raises(TransientError):  # once running, it is retried like an outage
        backend.put_bytes("x", b"x")
    backend.close()


def test_malformed_endpoint(s3_env: S3Server) -> None:
    with pytest.raises(PermanentError, match="endpoint_url"):
        s3_backend(s3_env, "b-b-b", endpoint_url="not a url")


def test_throttling_is_transient_and_retried(
    s3_env: S3Server, s3_proxy: S3Proxy, monkeypatch: pytest.MonkeyPatch
) -> None:
    backend = s3_backend(s3_env, new_bucket(s3_env), endpoint_url=s3_proxy.endpoint_url)
    s3_proxy.refuse("PUT /", times=1, status=503, code="SlowDown")
    with pytest.raises(TransientError, match="SlowDown"):
        backend.put_bytes("m.json", b"{}")
    monkeypatch.setenv("AWS_MAX_ATTEMPTS", "3")  # boto3's own retries absorb one SlowDown
    backend = s3_backend(s3_env, new_bucket(s3_env), endpoint_url=s3_proxy.endpoint_url)
    s3_proxy.refuse("PUT /", times=1, status=503, code="SlowDown")
    backend.put_bytes("m.json", b"{}")
    assert backend.get_bytes("m.json") == b"{}"
    backend.close()


def test_access_denied_names_the_permissions(s3_env: S3Server, s3_proxy: S3Proxy) -> None:
    bucket = new_bucket(s3_env)
    backend = s3_backend(s3_env, bucket, endpoint_url=s3_proxy.endpoint_url)
    s3_proxy.refuse("PUT /", times=1, status=403, code="AccessDenied")
    with pytest.raises(PermanentError) as err:
        backend.put_bytes("m.json", b"{}")
    assert "s3:PutObject" in str(err.value) and f"arn:aws:s3:::{bucket}" in str(err.value)
    backend.close()


def test_allowed_regions(s3_env: S3Server) -> None:
    bucket = new_bucket(s3_env)
    refused = s3_backend(s3_env, bucket, allowed_regions=["ca-central-1"])
    with pytest.raises(DestinationRejected) as err:
        refused.check()
    assert "us-east-1" in str(err.value) and "ca-central-1" in str(err.value)
    allowed = s3_backend(s3_env, bucket, allowed_regions=["ca-central-1", "us-east-1"])
    allowed.check()
    refused.close()
    allowed.close()
