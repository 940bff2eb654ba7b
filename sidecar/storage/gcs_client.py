"""Credentials, HTTP session and google-cloud-storage client for the GCS backend.

Anonymous when an emulator host is given (``STORAGE_EMULATOR_HOST``), else the key file
``destination.gcs.credentials_file`` (a service-account or workload-identity-federation
JSON), else Application Default Credentials (GKE Workload Identity, the VM's service
account, ``GOOGLE_APPLICATION_CREDENTIALS``, gcloud). Credentials and tokens are never
logged or put in a message; a file that cannot be used is named, its content is not.
"""

from __future__ import annotations

import google.auth
from google.auth import exceptions as auth_exceptions
from google.auth.credentials import AnonymousCredentials, Credentials
from google.auth.transport.requests import AuthorizedSession
from google.cloud import storage

from sidecar.storage.base import DestinationRejected
from sidecar.storage.blockwise import BlockwiseAdapter
from sidecar.storage.http_env import read_env_once
from sidecar.storage.options import GcsOptions

__all__ = ["POOL", "SCOPE", "connect"]

SCOPE = "https://www.googleapis.com/auth/devstorage.read_write"
POOL = 64  # connections kept per host: upload workers x parts in flight


def _credentials(opts: GcsOptions, emulator: bool) -> tuple[Credentials, str | None]:
    if emulator:
        return AnonymousCredentials(), opts.project  # type: ignore[no-untyped-call]
    try:
        if opts.credentials_file:
            creds, project = google.auth.load_credentials_from_file(  # type: ignore[no-untyped-call]
                opts.credentials_file, scopes=[SCOPE]
            )
        else:
            creds, project = google.auth.default(scopes=[SCOPE])
    except auth_exceptions.GoogleAuthError as e:
        source = (
            f"destination.gcs.credentials_file {opts.credentials_file!r}"
            if opts.credentials_file
            else "Application Default Credentials"
        )
        raise DestinationRejected(
            f"GCS credentials: {source} unusable ({type(e).__name__}); set "
            "destination.gcs.credentials_file to a service-account key file, or provide ADC "
            "(GKE Workload Identity, the VM's service account, GOOGLE_APPLICATION_CREDENTIALS)"
        ) from None
    return creds, opts.project or project


def connect(
    opts: GcsOptions, emulator_host: str | None
) -> tuple[AuthorizedSession, storage.Client]:
    """One authorized session (a pool of ``POOL`` connections) and a client that uses it.

    Raises :class:`DestinationRejected` when no credentials can be had.
    """
    endpoint = None
    if emulator_host is not None:
        endpoint = emulator_host if "://" in emulator_host else f"http://{emulator_host}"
    creds, project = _credentials(opts, emulator_host is not None)
    http = AuthorizedSession(creds)  # type: ignore[no-untyped-call]
    adapter = BlockwiseAdapter(pool_connections=4, pool_maxsize=POOL)  # see .body
    http.mount("https://", adapter)
    http.mount("http://", adapter)
    read_env_once(http, endpoint or "https://storage.googleapis.com")
    client = storage.Client(
        project=project,
        credentials=creds,
        _http=http,
        client_options={"api_endpoint": endpoint} if endpoint else None,
    )
    return http, client
