"""Build the boto3 S3 client from ``destination.s3`` without overriding what the user did
not configure: credentials, region, endpoint, retries and profile come from boto3's own
chain (environment, shared files, web identity, instance profile) unless set here.
"""

from __future__ import annotations

import email.utils
from collections.abc import Mapping
from typing import Any

import botocore.session
from botocore.config import Config
from botocore.handlers import convert_body_to_file_like_object

from sidecar.storage.base import DestinationRejected
from sidecar.storage.body import BLOCK, BytesBody
from sidecar.storage.options import S3Options

__all__ = [
    "CONNECT_TIMEOUT_SECONDS",
    "EXPECT_CONTINUE_MIN_BYTES",
    "full_crc",
    "make_client",
    "no_expect_for_small_bodies",
    "store_time",
    "write_args",
]

#: Seconds to wait for a TCP connection (botocore's default is 60: with its 3 attempts, a
#: firewalled endpoint stalled start-up for 3 minutes before the first log line). Reads keep
#: botocore's 60 s.
CONNECT_TIMEOUT_SECONDS = 10.0

#: PutObject and UploadPart bodies at least this large wait for the store's ``100 Continue``
#: before they are sent; smaller ones go with their headers. Waiting costs a round trip per
#: request, worth it only when a refused body would be large to send for nothing. The AWS
#: SDKs for Go and Kotlin draw the same line (``ContinueHeaderThresholdBytes``, 2 MB).
EXPECT_CONTINUE_MIN_BYTES = 2 * 1024 * 1024


def make_client(opts: S3Options, *, pool_size: int) -> Any:
    """A thread-safe botocore S3 client. Raises :class:`DestinationRejected` on bad settings.

    Payload SHA-256 signing is turned off unless the profile turns it on: every body
    carries a CRC32C that the store verifies, and over HTTPS botocore skips it anyway.
    A connection attempt gives up after :data:`CONNECT_TIMEOUT_SECONDS`.
    """
    session = botocore.session.Session(profile=opts.profile)
    try:
        scoped = session.get_scoped_config().get("s3", {})
    except Exception as e:  # botocore ProfileNotFound and friends
        raise DestinationRejected(
            f"S3 profile {opts.profile or '(from AWS_PROFILE)'!r} cannot be used "
            f"({type(e).__name__}); fix destination.s3.profile or AWS_PROFILE"
        ) from e
    s3_cfg: dict[str, Any] = {}
    if not isinstance(scoped, dict) or "payload_signing_enabled" not in scoped:
        s3_cfg["payload_signing_enabled"] = False
    if opts.addressing_style != "auto":
        s3_cfg["addressing_style"] = opts.addressing_style
    config = Config(
        s3=s3_cfg, max_pool_connections=pool_size, connect_timeout=CONNECT_TIMEOUT_SECONDS
    )
    kwargs: dict[str, Any] = {"config": config}
    if opts.region:
        kwargs["region_name"] = opts.region
    if opts.endpoint_url:
        kwargs["endpoint_url"] = opts.endpoint_url
    try:
        client = session.create_client("s3", **kwargs)
    except ValueError as e:  # botocore's InvalidEndpoint / InvalidRegion
        raise DestinationRejected(
            f"S3 client cannot be built: {e}; fix destination.s3.endpoint_url / region "
            "(or AWS_ENDPOINT_URL_S3 / AWS_REGION)"
        ) from e
    _send_bodies_as_read(client)
    _send_in_blocks(client)
    # botocore adds the header on "before-call.s3"; registered last, this runs after it.
    client.meta.events.register_last("before-call.s3", no_expect_for_small_bodies)
    return client


def _send_bodies_as_read(client: Any) -> None:
    """Send PutObject and UploadPart bodies from the ``bytes`` (or ``memoryview`` of a part
    buffer) they were read into, in blocks, without copying them.

    botocore wraps a ``bytes`` body in a ``BytesIO``, which urllib3 then copies out again
    block by block: one more copy of every byte uploaded, 0.1-0.15 CPU-s/GB here
    (bench/s3.md). A :class:`BytesBody` hands out the same blocks without copying. Sent as
    one block, a body had to go up within the connect timeout on a new connection
    (:mod:`.body`). Being file-like, it also gets botocore's ``Expect: 100-continue`` (when
    large, :func:`no_expect_for_small_bodies`), so a request the store refuses (a
    redirect, a failed precondition, a bad credential) is refused before its body is sent,
    and a retry rewinds it.
    """
    events = client.meta.events
    for op in ("PutObject", "UploadPart"):
        event = f"before-parameter-build.s3.{op}"
        events.unregister(event, convert_body_to_file_like_object)
        events.register(event, _body_in_blocks)


def _send_in_blocks(client: Any) -> None:
    """Send request bodies in blocks of :data:`~sidecar.storage.body.BLOCK` bytes instead of
    botocore's 128 KiB: one 2 GiB upload in 8 MiB parts spent about 0.1 CPU-s/GB less
    (bench/s3.md). botocore has no setting for it; the size is a keyword of the urllib3
    pool manager in its HTTP session, read when the first request to a host makes its
    connection pool. Where that is not found (another botocore, or the pool manager of a
    proxy, made later), botocore's size stays: as correct, only dearer."""
    session = getattr(getattr(client, "_endpoint", None), "http_session", None)
    pool_kw = getattr(getattr(session, "_manager", None), "connection_pool_kw", None)
    if isinstance(pool_kw, dict) and "blocksize" in pool_kw:
        pool_kw["blocksize"] = BLOCK


def _body_in_blocks(params: dict[str, Any], **_: Any) -> None:
    if isinstance(params.get("Body"), bytes | memoryview):
        params["Body"] = BytesBody(params["Body"])


def no_expect_for_small_bodies(params: dict[str, Any], **_: Any) -> None:
    """Drop botocore's ``Expect: 100-continue`` (which it adds to every file-like body) from
    bodies below :data:`EXPECT_CONTINUE_MIN_BYTES`: small files, manifests and short last
    parts go up in one round trip instead of two (bench/s3.md: 3,000 files of 4 KiB took
    14-24 % less time and CPU against SeaweedFS). A "before-call.s3" handler of every
    client :func:`make_client` builds."""
    body = params.get("body")
    if isinstance(body, BytesBody) and len(body) < EXPECT_CONTINUE_MIN_BYTES:
        params["headers"].pop("Expect", None)


def write_args(opts: S3Options) -> dict[str, Any]:
    """Extra arguments for every object write (PutObject, CreateMultipartUpload, CopyObject)."""
    args: dict[str, Any] = {}
    if opts.storage_class:
        args["StorageClass"] = opts.storage_class
    if opts.sse:
        args["ServerSideEncryption"] = opts.sse
    if opts.sse_kms_key_id:
        args["SSEKMSKeyId"] = opts.sse_kms_key_id
    if opts.bucket_key_enabled:
        args["BucketKeyEnabled"] = True
    return args


def store_time(response: Mapping[str, Any]) -> float | None:
    """The store's clock at the response (its ``Date`` header), seconds since the epoch."""
    date = response.get("ResponseMetadata", {}).get("HTTPHeaders", {}).get("date")
    return email.utils.parsedate_to_datetime(date).timestamp() if date else None


def full_crc(response: Mapping[str, Any]) -> str | None:
    """The whole-object CRC32C of a response, or None when absent or COMPOSITE."""
    crc = response.get("ChecksumCRC32C")
    if not crc or "-" in crc or response.get("ChecksumType") == "COMPOSITE":
        return None
    return str(crc)
