"""google-cloud-storage, google-auth and HTTP failures -> the errors of :mod:`sidecar.storage.base`.

Every message is one line naming the operation and the ``gs://`` location and, for a
permanent error, the fix. No message carries a credential or a token.
"""

from __future__ import annotations

import json
import re
from xml.etree import ElementTree

import requests
import urllib3
from google.api_core import exceptions as api_exceptions
from google.auth import exceptions as auth_exceptions
from google.cloud.storage import exceptions as storage_exceptions

from sidecar.storage.base import (
    AlreadyExists,
    ChecksumMismatch,
    NotFound,
    PermanentError,
    StorageError,
    TransientError,
)

__all__ = ["CorruptedInTransit", "map_error", "response_message", "status_error"]

# A resumable session URI is a bearer capability: never show its id.
_SESSION_ID = re.compile(r"((?:upload_id|uploadId)=)[^&\s]+")
_CHECKSUM_WORDS = ("crc32c", "md5", "checksum", "digest", "hash")
_ACCESS_FIX = (
    "grant the sidecar's service account roles/storage.objectUser on gs://{bucket} "
    "(storage.objects.create, get, list and delete)"
)
_CREDENTIALS_FIX = (
    "check destination.gcs.credentials_file, or Application Default Credentials "
    "(GOOGLE_APPLICATION_CREDENTIALS, GKE Workload Identity, the VM's service account)"
)


class CorruptedInTransit(ChecksumMismatch, TransientError):
    """The store (or a download) saw bytes whose CRC32C differs from the one computed.

    Both a :class:`ChecksumMismatch` and a :class:`TransientError`: the bytes were damaged
    on the way, so sending them again is the cure.
    """


def _where(bucket: str, name: str | None) -> str:
    return f"gs://{bucket}/{name}" if name else f"gs://{bucket}"


def status_error(
    status: int,
    message: str,
    *,
    op: str,
    bucket: str,
    name: str | None = None,
    bucket_level_404: bool = False,
) -> StorageError:
    """The error for an HTTP ``status`` answered to ``op``.

    ``bucket_level_404`` says a 404 can only mean the bucket is missing (an upload: the
    object need not exist); otherwise a 404 is :class:`NotFound` unless the server says
    the bucket is missing.
    """
    where = _where(bucket, name)
    msg = _SESSION_ID.sub(r"\1...", " ".join(message.split()))[:300] or "no message"
    low = msg.lower()
    if status == 404:
        if bucket_level_404 or ("bucket" in low and "not exist" in low):
            return PermanentError(
                f"GCS {op} {where}: bucket {bucket!r} does not exist (404: {msg}); check "
                f"destination.url or create it: gcloud storage buckets create gs://{bucket} "
                "--location=REGION"
            )
        return NotFound(f"{where} (GCS {op}: {msg})")
    if status == 412:
        return AlreadyExists(f"{where} already exists (GCS {op}: 412 {msg})")
    if status == 400 and any(w in low for w in _CHECKSUM_WORDS):
        return CorruptedInTransit(
            f"GCS {op} {where}: the store rejected the CRC32C sent (400: {msg}); the bytes "
            "were damaged on the way and are sent again"
        )
    if status == 401:
        return PermanentError(
            f"GCS {op} {where}: credentials were rejected (401: {msg}); {_CREDENTIALS_FIX}"
        )
    if status == 403:
        if "kms" in low or ("key" in low and "encrypt" in low):
            fix = (
                "grant the bucket project's Cloud Storage service agent "
                "roles/cloudkms.cryptoKeyEncrypterDecrypter on destination.gcs.kms_key_name"
            )
        else:
            fix = _ACCESS_FIX.format(bucket=bucket)
        return PermanentError(f"GCS {op} {where}: access denied (403: {msg}); {fix}")
    if status in (408, 410, 429) or status >= 500:
        return TransientError(f"GCS {op} {where}: {status} {msg}")
    return PermanentError(f"GCS {op} {where}: the request was refused ({status}: {msg})")


def response_message(resp: requests.Response) -> str:
    """The server's error message from a JSON or XML error body, else the raw text."""
    text = resp.text[:2000]
    try:
        body = json.loads(text)
        return str(body["error"]["message"])
    except (ValueError, KeyError, TypeError):
        pass
    try:
        root = ElementTree.fromstring(text)  # noqa: S314 - the configured endpoint's answer
        parts = [root.findtext("Code"), root.findtext("Message"), root.findtext("Details")]
        found = ": ".join(p for p in parts if p)
        if found:
            return found
    except ElementTree.ParseError:
        pass
    return text or (resp.reason or "")


def map_error(
    err: BaseException,
    *,
    op: str,
    bucket: str,
    name: str | None = None,
    bucket_level_404: bool = False,
    starting: bool = False,
) -> StorageError:
    """Translate ``err`` raised while doing ``op`` on ``gs://bucket/name``.

    ``starting`` marks the start-up check: an endpoint that cannot be reached then is a
    configuration error (permanent); later it is an outage (transient).
    """
    where = _where(bucket, name)
    if isinstance(err, StorageError):
        return err
    if isinstance(err, api_exceptions.RetryError) and err.cause is not None:
        return map_error(
            err.cause,
            op=op,
            bucket=bucket,
            name=name,
            bucket_level_404=bucket_level_404,
            starting=starting,
        )
    if isinstance(err, api_exceptions.GoogleAPICallError) and err.code is not None:
        return status_error(
            int(err.code),
            str(err.message),
            op=op,
            bucket=bucket,
            name=name,
            bucket_level_404=bucket_level_404,
        )
    if isinstance(err, storage_exceptions.DataCorruption):
        return CorruptedInTransit(f"GCS {op} {where}: CRC32C mismatch ({err.args[-1]})")
    if isinstance(err, storage_exceptions.InvalidResponse):
        resp = err.response
        return status_error(
            int(resp.status_code),
            response_message(resp),
            op=op,
            bucket=bucket,
            name=name,
            bucket_level_404=bucket_level_404,
        )
    if isinstance(err, auth_exceptions.DefaultCredentialsError):
        return PermanentError(
            f"GCS {op} {where}: no usable credentials ({err}); {_CREDENTIALS_FIX}"
        )
    if isinstance(err, auth_exceptions.RefreshError):
        reason = str(err.args[0]) if err.args else type(err).__name__
        if err.retryable:
            return TransientError(f"GCS {op} {where}: access token refresh failed ({reason})")
        return PermanentError(
            f"GCS {op} {where}: could not get an access token ({reason}); {_CREDENTIALS_FIX}"
        )
    if isinstance(err, auth_exceptions.TransportError):
        return TransientError(
            f"GCS {op} {where}: token endpoint unreachable ({type(err).__name__})"
        )
    # urllib3's own errors come from reading a streamed body (``resp.raw``)
    if isinstance(err, requests.exceptions.RequestException | urllib3.exceptions.HTTPError):
        if starting and isinstance(err, requests.exceptions.ConnectionError):
            return PermanentError(
                f"GCS {op} {where}: cannot reach the storage endpoint ({type(err).__name__}); "
                "check the network, proxy settings and STORAGE_EMULATOR_HOST"
            )
        return TransientError(f"GCS {op} {where}: connection failed ({type(err).__name__})")
    if isinstance(err, (ConnectionError, TimeoutError)):
        return TransientError(f"GCS {op} {where}: connection failed ({err})")
    return PermanentError(f"GCS {op} {where}: unexpected {type(err).__name__}: {err}")
