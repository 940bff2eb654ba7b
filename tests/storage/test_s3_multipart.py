"""S3 uploads: parts in parallel, the whole-object CRC32C on HEAD, cancel aborts."""

from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from sidecar.storage.base import Cancelled, NotFound
from sidecar.storage.checksum import crc32c_of_bytes, crc32c_of_file
from tests.conformance.test_s3 import MiB, s3_backend
from tests.servers.seaweedfs import S3Proxy, S3Server, new_bucket


def test_three_part_file_has_full_object_crc32c_on_head(s3_env: S3Server, tmp_path: Path) -> None:
    src = tmp_path / "model.safetensors"
    src.write_bytes(os.urandom(3 * 5 * MiB + 777))
    bucket = new_bucket(s3_env)
    backend = s3_backend(s3_env, bucket, "run")
    info = backend.put_file("step3/model.safetensors", src)
    assert info.crc32c == crc32c_of_file(src)
    assert backend.head("step3/model.safetensors").crc32c == info.crc32c
    raw = s3_env.client().head_object(
        Bucket=bucket, Key="run/step3/model.safetensors", PartNumber=1, ChecksumMode="ENABLED"
    )
    assert raw["PartsCount"] == 4
    plain = s3_env.client().head_object(
        Bucket=bucket, Key="run/step3/model.safetensors", ChecksumMode="ENABLED"
    )
    assert plain["ChecksumType"] == "FULL_OBJECT"
    assert plain["ChecksumCRC32C"] == info.crc32c
    backend.close()


def test_single_put_checksum_is_sent_and_on_head(
    s3_env: S3Server, s3_proxy: S3Proxy, tmp_path: Path
) -> None:
    data = os.urandom(200_000)
    src = tmp_path / "opt.pt"
    src.write_bytes(data)
    backend = s3_backend(s3_env, new_bucket(s3_env), endpoint_url=s3_proxy.endpoint_url)
    backend.put_file("opt.pt", src)
    put = [r for r in s3_proxy.requests if r.method == "PUT" and r.path.endswith("/opt.pt")]
    assert put[0].headers["x-amz-checksum-crc32c"] == crc32c_of_bytes(data)
    assert backend.head("opt.pt").crc32c == crc32c_of_bytes(data)
    backend.close()


def test_only_large_bodies_wait_for_the_stores_go_ahead(
    s3_env: S3Server, s3_proxy: S3Proxy, tmp_path: Path
) -> None:
    # Waiting for "100 Continue" costs a round trip a request: a small file, or the short
    # last part of a large one, goes with its headers; a 5 MiB part waits.
    small = tmp_path / "config.bin"
    small.write_bytes(os.urandom(100_000))
    big = tmp_path / "model.bin"
    big.write_bytes(os.urandom(2 * 5 * MiB + 777))
    backend = s3_backend(s3_env, new_bucket(s3_env), endpoint_url=s3_proxy.endpoint_url)
    backend.put_file("config.bin", small)
    backend.put_file("model.bin", big)
    waited = {
        (r.path.split("?")[0].rsplit("/", 1)[-1], r.body_size): any(
            k.lower() == "expect" and v == "100-continue" for k, v in r.headers.items()
        )
        for r in s3_proxy.requests
        if r.method == "PUT"
    }
    assert waited == {
        ("config.bin", 100_000): False,
        ("model.bin", 5 * MiB): True,
        ("model.bin", 777): False,
    }
    assert backend.head("config.bin").crc32c == crc32c_of_file(small)
    assert backend.head("model.bin").crc32c == crc32c_of_file(big)
    backend.close()


def test_parts_go_up_in_parallel_and_bounded(
    s3_env: S3Server, s3_proxy: S3Proxy, tmp_path: Path
) -> None:
    src = tmp_path / "big.bin"
    src.write_bytes(os.urandom(6 * 5 * MiB))
    backend = s3_backend(
        s3_env, new_bucket(s3_env), endpoint_url=s3_proxy.endpoint_url, part_concurrency=3
    )
    backend.put_file("big.bin", src)
    parts = [r for r in s3_proxy.requests if "partNumber=" in r.path]
    assert len(parts) == 6
    assert {r.body_size for r in parts} == {5 * MiB}
    assert 2 <= s3_proxy.max_in_flight("partNumber=") <= 3
    backend.close()


def test_cancel_aborts_the_multipart_upload(s3_env: S3Server, tmp_path: Path) -> None:
    src = tmp_path / "big.bin"
    src.write_bytes(os.urandom(4 * 5 * MiB))
    bucket = new_bucket(s3_env)
    backend = s3_backend(s3_env, bucket)
    seen = 0

    def cancel_after_two_parts(n: int) -> None:
        nonlocal seen
        seen += n
        if seen > 2 * 5 * MiB:
            raise Cancelled("superseded")

    with pytest.raises(Cancelled):
        backend.put_file("big.bin", src, progress=cancel_after_two_parts)
    assert s3_env.client().list_multipart_uploads(Bucket=bucket).get("Uploads", []) == []
    with pytest.raises(NotFound):
        backend.head("big.bin")
    backend.close()


def test_unreadable_part_aborts_too(s3_env: S3Server, tmp_path: Path) -> None:
    src = tmp_path / "big.bin"
    src.write_bytes(os.urandom(3 * 5 * MiB))
    bucket = new_bucket(s3_env)
    backend = s3_backend(s3_env, bucket)

    def disk_fails(n: int) -> None:
        raise OSError(5, "Input/output error")

    with pytest.raises(OSError):
        backend.put_file("big.bin", src, progress=disk_fails)
    assert s3_env.client().list_multipart_uploads(Bucket=bucket).get("Uploads", []) == []
    backend.close()


def test_memory_budget_is_shared_by_concurrent_uploads(
    s3_env: S3Server, s3_proxy: S3Proxy, tmp_path: Path
) -> None:
    # Two files at once with part_concurrency=2: never more than 2 parts held/sent together.
    backend = s3_backend(
        s3_env, new_bucket(s3_env), endpoint_url=s3_proxy.endpoint_url, part_concurrency=2
    )
    files = []
    for i in range(2):
        files.append(tmp_path / f"f{i}")
        files[-1].write_bytes(os.urandom(3 * 5 * MiB))
    with ThreadPoolExecutor(2) as pool:
        list(pool.map(lambda p: backend.put_file(p.name, p), files))
    assert len([r for r in s3_proxy.requests if "partNumber=" in r.path]) == 6
    assert s3_proxy.max_in_flight("partNumber=") <= 2
    backend.close()


def test_reused_part_buffers_never_mix_bytes_of_files(s3_env: S3Server, tmp_path: Path) -> None:
    # Three files at once through two part buffers, each file ending in a short part: a
    # buffer that came back from a full part must not leak its old bytes into the next one.
    backend = s3_backend(s3_env, new_bucket(s3_env), part_concurrency=2)
    sizes = [3 * 5 * MiB + 777, 2 * 5 * MiB + 1, 5 * MiB + 12_345, 4 * 5 * MiB]
    files = {}
    for i, size in enumerate(sizes):
        files[f"f{i}"] = tmp_path / f"f{i}"
        files[f"f{i}"].write_bytes(os.urandom(size))
    with ThreadPoolExecutor(3) as pool:
        infos = list(pool.map(lambda k: backend.put_file(k, files[k]), files))
    for info in infos:
        data = files[info.key].read_bytes()
        assert info.size == len(data)
        assert backend.get_bytes(info.key) == data
    backend.close()


def test_small_files_through_reused_buffers_go_up_whole(s3_env: S3Server, tmp_path: Path) -> None:
    # A small file after a larger one reuses its buffer: only the file's own bytes go up.
    backend = s3_backend(s3_env, new_bucket(s3_env), part_concurrency=1)
    for name, size in [("big", 5 * MiB + 3), ("small", 1000), ("empty", 0), ("mid", 300_001)]:
        src = tmp_path / name
        src.write_bytes(os.urandom(size))
        info = backend.put_file(name, src)
        assert info.size == size
        assert info.crc32c == crc32c_of_file(src)
        assert backend.get_bytes(name) == src.read_bytes()
    backend.close()
