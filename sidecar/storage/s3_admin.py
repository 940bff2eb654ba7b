"""Start-up duties of the S3 backend: check the destination, sweep stale multipart uploads."""

from __future__ import annotations

import time
from typing import Any

import structlog

from sidecar.storage.base import DestinationRejected, NotFound
from sidecar.storage.s3_client import store_time
from sidecar.storage.s3_errors import map_error

__all__ = ["abort_stale_uploads", "bucket_region", "check_destination"]

log = structlog.get_logger("sidecar.storage.s3")


def bucket_region(client: Any, bucket: str) -> str:
    """The bucket's region from GetBucketLocation (``us-east-1`` when it names none)."""
    try:
        r = client.get_bucket_location(Bucket=bucket)
    except Exception as e:
        raise map_error(e, op="GetBucketLocation", bucket=bucket, starting=True) from e
    loc = r.get("LocationConstraint") or "us-east-1"
    return "eu-west-1" if loc == "EU" else str(loc)


def check_destination(client: Any, bucket: str, prefix: str, allowed_regions: list[str]) -> None:
    """Raise :class:`PermanentError` unless the prefix can be listed (bucket exists,
    credentials, endpoint and region work), and :class:`DestinationRejected` when
    ``allowed_regions`` is not empty and the bucket's region is not in it."""
    try:
        client.list_objects_v2(Bucket=bucket, Prefix=f"{prefix}/" if prefix else "", MaxKeys=1)
    except Exception as e:
        raise map_error(e, op="ListObjectsV2", bucket=bucket, starting=True) from e
    if not allowed_regions:
        return
    region = bucket_region(client, bucket)
    if region not in allowed_regions:
        raise DestinationRejected(
            f"bucket {bucket!r} is in region {region}, which is not in "
            f"destination.allowed_regions {allowed_regions}; use a bucket in an allowed "
            "region or change the list"
        )


def abort_stale_uploads(client: Any, bucket: str, prefix: str, older_than_seconds: float) -> int:
    """Abort multipart uploads under ``prefix`` initiated at least ``older_than_seconds``
    before the store's current time (the ``Date`` of its listing answer, not ours).
    Returns how many were aborted."""
    base = f"{prefix}/" if prefix else ""
    stale: list[tuple[str, str]] = []
    try:
        for page in client.get_paginator("list_multipart_uploads").paginate(
            Bucket=bucket, Prefix=base
        ):
            now = store_time(page) or time.time()
            for up in page.get("Uploads", []):
                if now - up["Initiated"].timestamp() >= older_than_seconds:
                    stale.append((str(up["Key"]), str(up["UploadId"])))
    except Exception as e:
        raise map_error(e, op="ListMultipartUploads", bucket=bucket) from e
    for key, upload_id in stale:
        try:
            client.abort_multipart_upload(Bucket=bucket, Key=key, UploadId=upload_id)
        except Exception as e:
            err = map_error(e, op="AbortMultipartUpload", bucket=bucket, key=key)
            if not isinstance(err, NotFound):
                raise err from e
    if stale:
        log.info("s3_stale_multipart_aborted", bucket=bucket, prefix=base, count=len(stale))
    return len(stale)
