"""botocore exceptions -> the storage errors of :mod:`sidecar.storage.base`.

Every message names the operation and the bucket (never a credential) and, for a
permanent error, the likely fix.
"""

from __future__ import annotations

from botocore.exceptions import (
    BotoCoreError,
    ClientError,
    ConnectionClosedError,
    ConnectTimeoutError,
    EndpointConnectionError,
    FlexibleChecksumError,
    NoCredentialsError,
    PartialCredentialsError,
    ProxyConnectionError,
    ReadTimeoutError,
    SSLError,
)

from sidecar.storage.base import (
    AlreadyExists,
    ChecksumMismatch,
    NotFound,
    PermanentError,
    StorageError,
    TransientError,
)

__all__ = ["StoreRejectedChecksum", "error_code", "map_error"]

_NOT_FOUND = {"NoSuchKey", "404", "NotFound", "NoSuchUpload"}
_TRANSIENT = {
    "SlowDown",
    "Throttling",
    "ThrottlingException",
    "RequestLimitExceeded",
    "TooManyRequests",
    "InternalError",
    "ServiceUnavailable",
    "RequestTimeout",
    "RequestTimeTooSkewed",
    "ConditionalRequestConflict",
    "OperationAborted",
}
_BAD_DIGEST = {"BadDigest", "InvalidDigest", "XAmzContentSHA256Mismatch"}
_CREDENTIALS = {"InvalidAccessKeyId", "SignatureDoesNotMatch", "ExpiredToken", "InvalidToken"}
_DENIED = {"AccessDenied", "403", "AllAccessDisabled", "AccountProblem"}
_REGION = {"AuthorizationHeaderMalformed", "PermanentRedirect", "301", "IllegalLocationConstraint"}


class StoreRejectedChecksum(ChecksumMismatch, TransientError):
    """The store answered BadDigest: the bytes it received do not match the CRC32C sent.

    Both a :class:`ChecksumMismatch` and a :class:`TransientError`: the bytes were damaged
    on the way, so sending them again (the backend already did, a few times) is the cure.
    """


def error_code(err: ClientError) -> str:
    """The S3 error code, or the HTTP status as a string when the response had no body."""
    code = str(err.response.get("Error", {}).get("Code") or "")
    if not code:
        code = str(err.response.get("ResponseMetadata", {}).get("HTTPStatusCode", ""))
    return code


def _status(err: ClientError) -> int:
    status = err.response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0)
    return int(status or 0)


def map_error(
    err: Exception, *, op: str, bucket: str, key: str | None = None, starting: bool = False
) -> StorageError:
    """Translate ``err`` raised by ``op`` (an S3 operation name) on ``bucket``/``key``.

    ``starting`` marks the start-up check: an endpoint that cannot be reached then is a
    permanent configuration error; later it is a transient outage.
    """
    where = f"S3 {op} on bucket {bucket!r}" + (f", key {key!r}" if key else "")
    if isinstance(err, ClientError):
        return _map_client_error(err, where, bucket)
    if isinstance(err, NoCredentialsError | PartialCredentialsError):
        return PermanentError(
            f"{where}: no usable AWS credentials ({type(err).__name__}); set AWS_ACCESS_KEY_ID "
            "and AWS_SECRET_ACCESS_KEY, AWS_PROFILE / destination.s3.profile, or attach a role"
        )
    if isinstance(err, FlexibleChecksumError):
        return ChecksumMismatch(f"{where}: downloaded bytes do not match the stored checksum")
    if isinstance(err, EndpointConnectionError | ConnectTimeoutError):
        msg = f"{where}: cannot reach the endpoint ({err})"
        if starting:
            return PermanentError(
                f"{msg}; check destination.s3.endpoint_url / AWS_ENDPOINT_URL_S3 and the network"
            )
        return TransientError(msg)
    if isinstance(err, SSLError | ProxyConnectionError):
        what = "TLS with the endpoint failed" if isinstance(err, SSLError) else "the proxy failed"
        msg = f"{where}: {what} ({err})"
        if starting:  # a wrong CA bundle, a self-signed endpoint, a bad HTTPS_PROXY: no outage
            return PermanentError(
                f"{msg}; check the endpoint's certificate and AWS_CA_BUNDLE, "
                "destination.s3.endpoint_url, and HTTPS_PROXY / NO_PROXY"
            )
        return TransientError(msg)
    if isinstance(err, ConnectionClosedError | ReadTimeoutError | ConnectionError | TimeoutError):
        return TransientError(f"{where}: connection failed ({err})")
    if isinstance(err, BotoCoreError):
        return TransientError(f"{where}: {err}")
    return TransientError(f"{where}: {type(err).__name__}: {err}")


def _map_client_error(err: ClientError, where: str, bucket: str) -> StorageError:
    code = error_code(err)
    status = _status(err)
    if code == "NoSuchBucket":
        return PermanentError(
            f"{where}: the bucket does not exist (NoSuchBucket); create it or fix destination.url"
        )
    if code in _NOT_FOUND:
        return NotFound(f"{where}: not found")
    if code in ("PreconditionFailed", "412"):
        return AlreadyExists(f"{where}: an object already exists (412 PreconditionFailed)")
    if code in _BAD_DIGEST:
        return StoreRejectedChecksum(f"{where}: the store rejected the checksum ({code})")
    if code in _CREDENTIALS:
        return PermanentError(
            f"{where}: the store rejected the credentials ({code}); check AWS_ACCESS_KEY_ID / "
            "AWS_SECRET_ACCESS_KEY / AWS_PROFILE, and that the endpoint and region are right"
        )
    if code in _DENIED:
        return PermanentError(
            f"{where}: access denied ({code}); grant this identity s3:ListBucket, s3:GetObject, "
            f"s3:PutObject, s3:DeleteObject and s3:AbortMultipartUpload on arn:aws:s3:::{bucket} "
            "(see deploy/cloud), and check the bucket policy and any KMS key policy"
        )
    if code in _REGION:
        region = (
            err.response.get("ResponseMetadata", {})
            .get("HTTPHeaders", {})
            .get("x-amz-bucket-region", "another region")
        )
        return PermanentError(
            f"{where}: the bucket is in {region} ({code}); set destination.s3.region or "
            "AWS_REGION to the bucket's region"
        )
    if code in _TRANSIENT or status >= 500 or status == 429:
        return TransientError(f"{where}: {code} (HTTP {status}); will retry")
    return PermanentError(f"{where}: {code} (HTTP {status}): {err}")
