"""Per-backend options (`destination.s3.*`, `destination.gcs.*`, `destination.azure.*`).

Each backend owns its own class here; the config loader validates them before start.
Secrets are ``SecretStr`` so that printing the config never shows them.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, SecretStr, field_validator, model_validator

__all__ = ["AzureOptions", "GcsOptions", "S3Options"]

MiB = 1024 * 1024


class _Options(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class S3Options(_Options):
    """Options for ``s3://bucket/prefix``; unset values fall back to boto3's own chain.

    ``endpoint_url``, ``region`` and ``profile`` left unset mean what boto3 does by itself
    (``AWS_ENDPOINT_URL_S3`` / ``AWS_ENDPOINT_URL``, ``AWS_REGION``, ``AWS_PROFILE``, the
    shared config files, web identity, instance profile). Files of at least
    ``multipart_threshold_bytes`` go up in parts of ``part_size_bytes`` (raised when a file
    would need more than 10,000 parts), ``part_concurrency`` at a time; memory per
    backend (all files together) is at most ``part_concurrency`` part buffers. The default
    of 6 keeps the daemon under 150 MB while it uploads (bench/memory.md); on a fast link,
    more parts in flight go faster, at ``part_size_bytes`` of memory each.
    """

    endpoint_url: str | None = None
    region: str | None = None
    profile: str | None = None
    addressing_style: Literal["auto", "path", "virtual"] = "auto"
    storage_class: str | None = None
    sse: Literal["AES256", "aws:kms"] | None = None
    sse_kms_key_id: str | None = None
    bucket_key_enabled: bool = False
    multipart_threshold_bytes: int = Field(default=8 * MiB, ge=5 * MiB)
    part_size_bytes: int = Field(default=8 * MiB, ge=5 * MiB, le=5 * 1024 * MiB)
    part_concurrency: int = Field(default=6, ge=1, le=64)
    #: "classic" (= "auto"): our own multipart over botocore. The CRT client was measured
    #: and not adopted (bench/s3.md): it reads the file itself, so the whole-file CRC32C
    #: would need a second read, and its memory is 3x ours.
    transfer_client: Literal["auto", "classic"] = "auto"

    @model_validator(mode="after")
    def _check_sse(self) -> S3Options:
        if self.sse_kms_key_id and self.sse != "aws:kms":
            raise ValueError("sse_kms_key_id needs sse: aws:kms")
        if self.bucket_key_enabled and self.sse != "aws:kms":
            raise ValueError("bucket_key_enabled needs sse: aws:kms")
        return self


class GcsOptions(_Options):
    """Options for ``gs://bucket/prefix``.

    Credentials come from Application Default Credentials (GKE Workload Identity, the VM's
    service account, ``GOOGLE_APPLICATION_CREDENTIALS``, gcloud) or, when set, the key file
    ``credentials_file``; with ``STORAGE_EMULATOR_HOST`` set, none are used (anonymous).
    ``chunk_size_bytes``: the most bytes one resumable-upload request carries, a multiple
    of 256 KiB; ``None`` (the default) sends the whole file in one request but for its last
    256 KiB or less, which go with the CRC32C, as Google recommends. Requests are streamed
    from the file, so memory does not grow with them.
    ``xml_multipart_threshold_bytes``: files at least this large go up through the XML
    multipart API in parts of ``xml_part_size_bytes``, held in memory until sent;
    ``part_concurrency`` parts of all files together at once (memory: about
    ``part_concurrency * xml_part_size_bytes`` for the backend); ``None`` means 1 GiB on
    real GCS and never on an emulator, ``0`` means never.
    """

    credentials_file: str | None = None
    project: str | None = None
    storage_class: Literal["STANDARD", "NEARLINE", "COLDLINE", "ARCHIVE"] | None = None
    kms_key_name: str | None = Field(
        default=None, pattern=r"^projects/[^/]+/locations/[^/]+/keyRings/[^/]+/cryptoKeys/[^/]+$"
    )
    chunk_size_bytes: int | None = Field(default=None, ge=256 * 1024)
    xml_multipart_threshold_bytes: int | None = Field(default=None, ge=0)
    xml_part_size_bytes: int = Field(default=8 * MiB, ge=5 * MiB, le=5 * 1024 * MiB)
    part_concurrency: int = Field(default=6, ge=1, le=32)

    @field_validator("chunk_size_bytes")
    @classmethod
    def _chunk_multiple(cls, v: int | None) -> int | None:
        if v is not None and v % (256 * 1024):
            raise ValueError("must be a multiple of 256 KiB (262144 bytes), as GCS requires")
        return v


class AzureOptions(_Options):
    """Options for ``az://container/prefix`` and ``https://<account>.blob.core.windows.net/...``.

    Credentials, first match wins: ``use_default_credential`` (DefaultAzureCredential: managed
    or workload identity, needs the ``azure-identity`` extra); ``connection_string``;
    ``account_key``; ``sas_token``; then the environment (``AZURE_STORAGE_CONNECTION_STRING``,
    ``AZURE_STORAGE_KEY``, ``AZURE_STORAGE_SAS_TOKEN``); then DefaultAzureCredential.
    ``account`` falls back to ``AZURE_STORAGE_ACCOUNT``; ``account_url`` replaces the public
    endpoint (Azurite: ``http://127.0.0.1:10000/devstoreaccount1``, sovereign clouds).
    ``region`` is the account's region as the operator states it: Azure's data plane does not
    report one, so it is required when ``destination.allowed_regions`` is set.
    Files are staged in blocks of ``block_size_bytes`` (raised for a file that would need more
    than the service's 50,000 blocks: above about 390 GiB at 8 MiB). ``max_concurrency`` is
    the number of blocks in flight for the whole backend, all files together: block buffers
    take about ``block_size_bytes * max_concurrency`` (defaults: 8 MiB x 6 = 48 MiB, as S3's
    parts; AzCopy's default block size is also 8 MiB). On a fast link more blocks in flight go
    faster, each costing ``block_size_bytes`` of memory (bench/azure.md).
    Archive is not offered as a tier: an archived checkpoint cannot be restored or copied.
    """

    account: str | None = None
    account_url: str | None = None
    connection_string: SecretStr | None = None
    account_key: SecretStr | None = None
    sas_token: SecretStr | None = None
    use_default_credential: bool = False
    region: str | None = None
    access_tier: Literal["Hot", "Cool", "Cold"] | None = None
    encryption_scope: str | None = None
    customer_provided_key: SecretStr | None = None
    block_size_bytes: int = Field(default=8 * MiB, ge=1 * MiB, le=4000 * MiB)
    max_concurrency: int = Field(default=6, ge=1, le=64)
    copy_timeout_seconds: float = Field(default=900.0, gt=0)
