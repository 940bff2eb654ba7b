"""The store verifies what we send: damaged bytes are refused (BadDigest) and sent again;
server-side copy moves no object bytes through this process."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from sidecar.storage.base import AlreadyExists, ChecksumMismatch, TransientError
from sidecar.storage.checksum import crc32c_of_bytes
from sidecar.storage.s3 import S3Backend
from tests.conformance.test_s3 import MiB, s3_backend
from tests.servers.seaweedfs import S3Proxy, S3Server, new_bucket
from tests.storage.replaced import assert_a_replacement_midway_fails_the_download


def test_corrupted_part_is_rejected_by_the_store_and_sent_again(
    s3_env: S3Server, s3_proxy: S3Proxy, tmp_path: Path
) -> None:
    data = os.urandom(3 * 5 * MiB + 1)
    src = tmp_path / "w.pt"
    src.write_bytes(data)
    backend = s3_backend(s3_env, new_bucket(s3_env), endpoint_url=s3_proxy.endpoint_url)
    s3_proxy.corrupt("partNumber=2", times=1)
    info = backend.put_file("w.pt", src)
    part2 = [r for r in s3_proxy.requests if r.path.endswith("partNumber=2")]
    assert [r.status for r in part2] == [400, 200]  # BadDigest, then the retry
    assert backend.get_bytes("w.pt") == data
    assert info.crc32c == crc32c_of_bytes(data)
    backend.close()


def test_corrupted_single_put_is_rejected_and_sent_again(
    s3_env: S3Server, s3_proxy: S3Proxy
) -> None:
    backend = s3_backend(s3_env, new_bucket(s3_env), endpoint_url=s3_proxy.endpoint_url)
    s3_proxy.corrupt("PUT /", times=1)
    backend.put_bytes("m.json", b'{"step": 7}')
    assert [r.status for r in s3_proxy.requests if r.method == "PUT"] == [400, 200]
    assert backend.get_bytes("m.json") == b'{"step": 7}'
    backend.close()


def test_bytes_damaged_every_time_raise_a_retryable_checksum_error(
    s3_env: S3Server, s3_proxy: S3Proxy
) -> None:
    backend = s3_backend(s3_env, new_bucket(s3_env), endpoint_url=s3_proxy.endpoint_url)
    s3_proxy.corrupt("PUT /", times=100)
    with pytest.raises(ChecksumMismatch) as err:
        backend.put_bytes("m.json", b"{}")
    assert isinstance(err.value, TransientError)  # the uploader retries it later
    assert "BadDigest" in str(err.value)
    backend.close()


def stored_through_proxy(
    s3_env: S3Server, s3_proxy: S3Proxy, tmp_path: Path
) -> tuple[S3Backend, bytes]:
    """A backend talking through the proxy, and the bytes of ``w.pt`` it stored (three and a
    bit parts of 5 MiB)."""
    data = os.urandom(3 * 5 * MiB + 1)
    src = tmp_path / "w.pt"
    src.write_bytes(data)
    backend = s3_backend(s3_env, new_bucket(s3_env), endpoint_url=s3_proxy.endpoint_url)
    backend.put_file("w.pt", src)
    return backend, data


def test_a_large_object_comes_down_in_ranges_pinned_to_its_etag(
    s3_env: S3Server, s3_proxy: S3Proxy, tmp_path: Path
) -> None:
    backend, data = stored_through_proxy(s3_env, s3_proxy, tmp_path)
    seen: list[int] = []
    info = backend.get_file("w.pt", tmp_path / "back.pt", progress=seen.append)
    assert (tmp_path / "back.pt").read_bytes() == data
    assert info.crc32c == crc32c_of_bytes(data) and sum(seen) == len(data)
    ranged = [r for r in s3_proxy.requests if r.method == "GET" and "Range" in r.headers]
    assert sorted(r.headers["Range"] for r in ranged) == [
        "bytes=0-5242879",
        "bytes=10485760-15728639",
        "bytes=15728640-15728640",
        "bytes=5242880-10485759",
    ]
    assert all(r.headers.get("If-Match") for r in ranged)
    backend.close()


def test_an_object_replaced_during_a_ranged_download_fails_it(
    s3_env: S3Server, tmp_path: Path
) -> None:
    """One range at a time (``part_concurrency=1``): the first piece of the first range is
    reported, the object is replaced, and the next ranged GET finds another ETag. The error
    says so and is retried later; no file is left with bytes of two versions."""
    backend = s3_backend(s3_env, new_bucket(s3_env), part_concurrency=1)
    src = tmp_path / "w.pt"
    src.write_bytes(os.urandom(2 * 5 * MiB + 1))
    backend.put_file("w.pt", src)
    assert_a_replacement_midway_fails_the_download(
        backend, "w.pt", tmp_path / "back.pt", match="replaced during the download"
    )
    backend.close()


def test_bytes_damaged_on_the_way_down_fail_a_ranged_download(
    s3_env: S3Server, s3_proxy: S3Proxy, tmp_path: Path
) -> None:
    """A ranged GET carries no checksum of its own: the CRC32C combined from the ranges,
    checked against the store's whole-object one, is what catches it."""
    backend, _ = stored_through_proxy(s3_env, s3_proxy, tmp_path)
    s3_proxy.corrupt("GET /", times=100)
    with pytest.raises(ChecksumMismatch, match="the store reports"):
        backend.get_file("w.pt", tmp_path / "back.pt")
    assert not (tmp_path / "back.pt").exists()
    backend.close()


def test_copy_moves_no_bytes_through_the_client(
    s3_env: S3Server, s3_proxy: S3Proxy, tmp_path: Path
) -> None:
    data = os.urandom(2 * 5 * MiB + 99)
    src = tmp_path / "shard.bin"
    src.write_bytes(data)
    backend = s3_backend(s3_env, new_bucket(s3_env), endpoint_url=s3_proxy.endpoint_url)
    put = backend.put_file("step1/shard.bin", src)
    before = s3_proxy.body_bytes()
    copied = backend.copy("step1/shard.bin", "step2/shard.bin")
    assert s3_proxy.body_bytes() - before < 4096  # request XML only, no object bytes
    assert copied.crc32c == put.crc32c
    assert backend.head("step2/shard.bin").crc32c == put.crc32c
    assert backend.get_bytes("step2/shard.bin") == data
    backend.close()


def test_large_copy_uses_upload_part_copy(
    s3_env: S3Server, s3_proxy: S3Proxy, tmp_path: Path
) -> None:
    data = os.urandom(2 * 5 * MiB + 4321)
    src = tmp_path / "shard.bin"
    src.write_bytes(data)
    backend = s3_backend(s3_env, new_bucket(s3_env), endpoint_url=s3_proxy.endpoint_url)
    backend.copy_part_threshold = 5 * MiB  # stands in for S3's 5 GiB CopyObject limit
    backend.copy_part_size = 5 * MiB
    put = backend.put_file("a/shard.bin", src)
    before = len(s3_proxy.requests)
    copied = backend.copy("a/shard.bin", "b/shard.bin")
    copies = [r for r in s3_proxy.requests[before:] if "x-amz-copy-source-range" in r.headers]
    assert len(copies) == 3
    assert sum(r.body_size for r in s3_proxy.requests[before:]) < 4096
    assert copied.crc32c == put.crc32c
    assert backend.head("b/shard.bin").crc32c == put.crc32c
    assert backend.get_bytes("b/shard.bin") == data
    backend.close()


def test_create_only_is_enforced_by_the_store(s3_env: S3Server, s3_proxy: S3Proxy) -> None:
    bucket = new_bucket(s3_env)
    backend = s3_backend(s3_env, bucket, "run", endpoint_url=s3_proxy.endpoint_url)
    # another node committed this manifest first, with its own client
    s3_env.client().put_object(Bucket=bucket, Key="run/.ckpt-sidecar/manifests/s9.json", Body=b"A")
    with pytest.raises(AlreadyExists):
        backend.put_bytes(".ckpt-sidecar/manifests/s9.json", b"B", create_only=True)
    sent = s3_proxy.requests[-1]
    assert sent.headers["If-None-Match"] == "*" and sent.status == 412
    assert backend.get_bytes(".ckpt-sidecar/manifests/s9.json") == b"A"  # for the caller to compare
    backend.close()
