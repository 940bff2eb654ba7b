"""Destination URLs: ``file://``, ``memory://``, ``s3://``, ``gs://``, ``az://``, Azure ``https://``."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

__all__ = ["SCHEMES", "DestinationUrl", "DestinationUrlError", "parse_destination"]

SCHEMES = ("file", "memory", "s3", "gs", "az", "https")
_S3_BUCKET = re.compile(r"^[a-z0-9][a-z0-9.\-]{1,61}[a-z0-9]$")
_GCS_BUCKET = re.compile(r"^[a-z0-9][a-z0-9._\-]{1,220}[a-z0-9]$")
_AZ_CONTAINER = re.compile(r"^(?!.*--)[a-z0-9][a-z0-9\-]{1,61}[a-z0-9]$")
_AZ_HOST = re.compile(r"^([a-z0-9]{3,24})\.blob\.core\.windows\.net$")


class DestinationUrlError(ValueError):
    """The URL is not one we can upload to; the message says what is accepted."""


@dataclass(frozen=True)
class DestinationUrl:
    """A parsed destination. ``bucket`` is the S3/GCS bucket or the Azure container."""

    scheme: str
    raw: str
    bucket: str = ""
    prefix: str = ""
    path: Path | None = None
    account: str | None = None


def _prefix(path: str) -> str:
    p = path.strip("/")
    if any(seg in (".", "..") for seg in p.split("/") if seg):
        raise DestinationUrlError(f"destination prefix {path!r} must not contain '.' or '..'")
    return p


def parse_destination(url: str) -> DestinationUrl:
    """Parse and validate; raise :class:`DestinationUrlError` naming what is wrong."""
    if "://" not in url:
        raise DestinationUrlError(
            f"destination.url {url!r} has no scheme; use one of "
            "file:///mnt/volume/run, s3://bucket/prefix, gs://bucket/prefix, az://container/prefix"
        )
    scheme = url.split("://", 1)[0].lower()
    if scheme not in SCHEMES:
        raise DestinationUrlError(
            f"destination.url scheme {scheme!r} is not supported; use file, s3, gs or az"
        )
    rest = url.split("://", 1)[1]
    if scheme == "file":
        if not rest:
            raise DestinationUrlError("destination.url file:// needs a folder path")
        return DestinationUrl(scheme=scheme, raw=url, path=Path(rest))
    if scheme == "memory":
        return DestinationUrl(scheme=scheme, raw=url, bucket=rest or "default")
    parts = urlsplit(url)
    if parts.query or parts.fragment or parts.username or parts.password:
        raise DestinationUrlError(
            "destination.url must not carry credentials, a query or a fragment; "
            "give credentials through the environment or the backend's options"
        )
    if scheme == "https":
        m = _AZ_HOST.match(parts.hostname or "")
        if not m:
            raise DestinationUrlError(
                "an https destination must be an Azure Blob URL: "
                "https://<account>.blob.core.windows.net/<container>/<prefix>"
            )
        container, _, pfx = parts.path.lstrip("/").partition("/")
        _check_container(container)
        return DestinationUrl(
            scheme="az", raw=url, bucket=container, prefix=_prefix(pfx), account=m.group(1)
        )
    bucket = parts.netloc
    pfx = _prefix(parts.path)
    if scheme == "s3" and not _S3_BUCKET.match(bucket):
        raise DestinationUrlError(
            f"S3 bucket name {bucket!r} is not valid: 3-63 characters of a-z, 0-9, '.' and '-', "
            "starting and ending with a letter or digit"
        )
    if scheme == "gs" and not _GCS_BUCKET.match(bucket):
        raise DestinationUrlError(
            f"GCS bucket name {bucket!r} is not valid: 3-222 characters of a-z, 0-9, '.', '_' "
            "and '-', starting and ending with a letter or digit"
        )
    if scheme == "az":
        _check_container(bucket)
    return DestinationUrl(scheme=scheme, raw=url, bucket=bucket, prefix=pfx)


def _check_container(name: str) -> None:
    if not _AZ_CONTAINER.match(name):
        raise DestinationUrlError(
            f"Azure container name {name!r} is not valid: 3-63 characters of a-z, 0-9 and '-'"
        )
