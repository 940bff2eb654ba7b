"""Build the Azure ``ContainerClient`` for a destination: endpoint, credential, transport.

Nothing here touches the network. Credentials come from the options or the environment
(see :class:`~sidecar.storage.options.AzureOptions` for the order) and are never logged or
put into an error message.
"""

from __future__ import annotations

import base64
import hashlib
import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

import requests
from azure.core.pipeline.transport import RequestsTransport
from azure.storage.blob import (
    BlobServiceClient,
    ContainerClient,
    CustomerProvidedEncryptionKey,
    ExponentialRetry,
)
from urllib3.util.retry import Retry

from sidecar.storage.base import DestinationRejected
from sidecar.storage.blockwise import BlockwiseAdapter
from sidecar.storage.http_env import ca_bundle, read_env_once
from sidecar.storage.options import AzureOptions
from sidecar.storage.url import DestinationUrl

__all__ = [
    "CONNECT_TIMEOUT_SECONDS",
    "READ_TIMEOUT_SECONDS",
    "AzureTarget",
    "build_container_client",
    "customer_key",
]

_ENV_CONN = "AZURE_STORAGE_CONNECTION_STRING"

#: Seconds to wait for a TCP connection, and for the next bytes of a response, per attempt.
CONNECT_TIMEOUT_SECONDS = 10.0
READ_TIMEOUT_SECONDS = 120.0
#: A download's first GET and each ranged GET after it. The SDK's first GET defaults to
#: 32 MiB, received whole before its first byte is handed on: a restore of 100 files (four
#: downloads at once) peaked at 518 MB of RSS with it, 156 MB with this (bench/restore.md).
DOWNLOAD_GET_BYTES = 4 * 1024 * 1024
#: Bytes of a response body read at a time; azure-core's default, 4 KiB, made a download
#: cost 8-12 CPU-s/GB against Azurite, 1.9-3.2 with this (bench/restore.md).
RESPONSE_READ_BYTES = 256 * 1024


@dataclass(frozen=True)
class AzureTarget:
    """Where a destination points: the account (for messages) and the container client."""

    account: str
    container: ContainerClient


def _account_from_url(account_url: str) -> str:
    """Account name of an endpoint: the host's first label, or for an IP/localhost endpoint
    (Azurite) the first path segment."""
    parts = urlsplit(account_url)
    host = parts.hostname or ""
    if host in ("localhost", "host.docker.internal") or host.replace(".", "").isdigit():
        return parts.path.strip("/").split("/")[0]
    return host.split(".")[0]


def customer_key(opts: AzureOptions) -> CustomerProvidedEncryptionKey | None:
    """The customer-provided key (base64 of 32 bytes) with its SHA-256, or ``None``."""
    if opts.customer_provided_key is None:
        return None
    value = opts.customer_provided_key.get_secret_value()
    try:
        raw = base64.b64decode(value, validate=True)
    except ValueError:
        raw = b""
    if len(raw) != 32:
        raise DestinationRejected(
            "destination.azure.customer_provided_key must be the base64 of a 32-byte AES-256 key"
        )
    digest = base64.b64encode(hashlib.sha256(raw).digest()).decode("ascii")
    return CustomerProvidedEncryptionKey(key_value=value, key_hash=digest)


def _transport(pool_size: int) -> RequestsTransport:
    """A requests session whose pool holds every block in flight (the default keeps 10);
    it reads the environment's proxy and CA-bundle settings once (:mod:`.http_env`) and
    sends bodies in blocks, so a slow link is not cut off by the connect timeout
    (:mod:`.body`), and reads responses :data:`RESPONSE_READ_BYTES` at a time.

    The timeouts go here, not to the client: azure-core reads a client's
    ``connection_timeout`` / ``read_timeout`` only when it builds the transport itself, so
    with ours they were silently 300 s each."""
    session = requests.Session()
    adapter = BlockwiseAdapter(
        pool_connections=4,
        pool_maxsize=pool_size,
        max_retries=Retry(total=False, redirect=False, raise_on_status=False),
    )
    session.mount("http://", adapter)
    session.mount("https://", adapter)
    # azure-core passes ``verify`` with every request, overriding the session's own
    return RequestsTransport(
        session=session,
        session_owner=True,
        connection_verify=ca_bundle() or True,
        connection_timeout=CONNECT_TIMEOUT_SECONDS,
        read_timeout=READ_TIMEOUT_SECONDS,
        connection_data_block_size=RESPONSE_READ_BYTES,
    )


def _default_credential() -> Any:
    try:
        from azure.identity import DefaultAzureCredential
    except ImportError:
        raise DestinationRejected(
            "no Azure credential configured and azure-identity is not installed: set "
            "destination.azure.connection_string, account_key or sas_token (or "
            f"{_ENV_CONN}), or install the extra: pip install 'ckpt-sidecar[azure-identity]' "
            "for managed or workload identity"
        ) from None
    return DefaultAzureCredential()


def build_container_client(
    url: DestinationUrl, opts: AzureOptions, env: Mapping[str, str] = os.environ
) -> AzureTarget:
    """The container client for ``url``; raises :class:`DestinationRejected` naming the fix."""
    transport = _transport(max(16, 4 * opts.max_concurrency))
    kwargs: dict[str, Any] = {
        "transport": transport,
        "retry_policy": ExponentialRetry(initial_backoff=1, increment_base=2, retry_total=3),
        "max_single_get_size": DOWNLOAD_GET_BYTES,
        "max_chunk_get_size": DOWNLOAD_GET_BYTES,
    }
    if opts.account and url.account and opts.account != url.account:
        raise DestinationRejected(
            f"destination.url names Azure account {url.account!r} but destination.azure.account "
            f"is {opts.account!r}; remove one"
        )
    account = url.account or opts.account or env.get("AZURE_STORAGE_ACCOUNT")
    conn = opts.connection_string.get_secret_value() if opts.connection_string else None
    explicit = opts.use_default_credential or conn or opts.account_key or opts.sas_token
    if not explicit and env.get(_ENV_CONN):
        conn = env[_ENV_CONN]
    if conn and not opts.use_default_credential:
        try:
            service = BlobServiceClient.from_connection_string(conn, **kwargs)
        except ValueError:
            raise DestinationRejected(
                "the Azure connection string is malformed; copy it again from the portal "
                "(Access keys) or `az storage account show-connection-string`"
            ) from None
        if account and service.account_name != account:
            raise DestinationRejected(
                f"the Azure connection string is for account {service.account_name!r} but the "
                f"destination names {account!r}; use the matching connection string"
            )
        read_env_once(transport.session, service.url)
        return AzureTarget(str(service.account_name), service.get_container_client(url.bucket))
    if not account and not opts.account_url:
        raise DestinationRejected(
            f"az://{url.bucket} needs the storage account: set destination.azure.account or "
            "AZURE_STORAGE_ACCOUNT, or use https://<account>.blob.core.windows.net/<container>"
        )
    account_url = opts.account_url or f"https://{account}.blob.core.windows.net"
    account = account or _account_from_url(account_url)
    credential: Any
    key = opts.account_key.get_secret_value() if opts.account_key else None
    sas = opts.sas_token.get_secret_value() if opts.sas_token else None
    if opts.use_default_credential:
        credential = _default_credential()
    elif key:
        credential = {"account_name": account, "account_key": key}
    elif sas:
        credential = sas.lstrip("?")
    elif env.get("AZURE_STORAGE_KEY"):
        credential = {"account_name": account, "account_key": env["AZURE_STORAGE_KEY"]}
    elif env.get("AZURE_STORAGE_SAS_TOKEN"):
        credential = env["AZURE_STORAGE_SAS_TOKEN"].lstrip("?")
    else:
        credential = _default_credential()
    service = BlobServiceClient(account_url, credential=credential, **kwargs)
    read_env_once(transport.session, service.url)
    return AzureTarget(account, service.get_container_client(url.bucket))
