"""azure-core exceptions -> the storage errors of :mod:`sidecar.storage.base`.

Every message is one line naming the account, container, operation and key, and for a
permanent error the fix. The SDK's own message is left out: a connection error's text
carries the request URL, which holds the signature when a SAS token is used.
"""

from __future__ import annotations

from azure.core.exceptions import (
    ClientAuthenticationError,
    HttpResponseError,
    ResourceExistsError,
    ResourceModifiedError,
    ServiceRequestError,
)

from sidecar.storage.base import (
    AlreadyExists,
    ChecksumMismatch,
    NotFound,
    PermanentError,
    StorageError,
    TransientError,
)

__all__ = ["error_code", "map_error"]

_AUTH = {
    "AuthenticationFailed",
    "AuthorizationFailure",
    "AuthorizationPermissionMismatch",
    "AuthorizationPermissionDenied",
    "AuthorizationResourceTypeMismatch",
    "AuthorizationServiceMismatch",
    "AuthorizationSourceIPMismatch",
    "AuthorizationProtocolMismatch",
    "InsufficientAccountPermissions",
    "InvalidAuthenticationInfo",
    "NoAuthenticationInformation",
    "KeyVaultEncryptionKeyNotFound",
}
_CHECKSUM = {"Md5Mismatch", "Crc64Mismatch", "InvalidMd5"}
_TRANSIENT_STATUS = {408, 429, 500, 502, 503, 504}
_TRANSIENT_CODES = {"OperationTimedOut", "ServerBusy", "InternalError", "ContainerBeingDeleted"}
_CREDENTIAL_FIX = (
    "check destination.azure credentials (account key, SAS token with read/write/list/"
    "delete/create permissions, connection string, or an identity holding the role "
    "'Storage Blob Data Contributor')"
)


def error_code(err: HttpResponseError) -> str:
    """The service's error code (``x-ms-error-code``) as a plain string, or ``""``."""
    code = getattr(err, "error_code", None) or ""
    return str(getattr(code, "value", code))


def map_error(
    err: Exception, *, op: str, account: str, container: str, key: str, starting: bool = False
) -> StorageError:
    """Translate ``err`` raised by ``op`` on ``key`` in ``account``/``container``.

    ``starting`` marks the start-up check: a service that cannot be reached then (a wrong
    account or endpoint, TLS that fails, no route) is a setting to fix; later, an outage."""
    where = f"Azure {op} of {key!r} in account {account!r}, container {container!r}"
    if isinstance(err, ClientAuthenticationError) and err.response is None:
        return PermanentError(f"{where}: no usable credential; {_CREDENTIAL_FIX}")
    if not isinstance(err, HttpResponseError) or err.response is None:
        kind = type(err).__name__
        if isinstance(err, ServiceRequestError):
            if starting:
                return PermanentError(
                    f"{where}: the service could not be reached ({kind}); check the account "
                    "name and endpoint in destination.url, the network, and TLS "
                    "(REQUESTS_CA_BUNDLE, HTTPS_PROXY / NO_PROXY)"
                )
            return TransientError(f"{where}: the service could not be reached ({kind})")
        return TransientError(f"{where}: the request failed on the way ({kind})")
    code = error_code(err)
    status = int(err.status_code or 0)
    if code == "ContainerNotFound":
        return PermanentError(
            f"{where}: the container does not exist; create it "
            f"(az storage container create --account-name {account} --name {container}) "
            "or fix destination.url"
        )
    exists = code in ("BlobAlreadyExists", "ConditionNotMet", "") or status == 412
    if isinstance(err, ResourceExistsError | ResourceModifiedError) and exists:
        return AlreadyExists(f"{where}: already exists")
    if status == 404:
        return NotFound(f"{where}: not found ({code or 404})")
    if code in _CHECKSUM:
        return ChecksumMismatch(f"{where}: the service rejected the block checksum ({code})")
    if status in (401, 403) or code in _AUTH:
        return PermanentError(f"{where}: access refused ({status} {code}); {_CREDENTIAL_FIX}")
    if status in _TRANSIENT_STATUS or code in _TRANSIENT_CODES:
        return TransientError(f"{where}: the service is busy or failing ({status} {code})")
    return PermanentError(f"{where}: refused ({status} {code}); fix the request or its options")
