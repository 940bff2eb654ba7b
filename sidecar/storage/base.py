"""The one storage interface every destination implements.

Keys are ``/``-separated, relative to the destination URL's prefix, never start
with ``/`` and never contain ``..`` segments. Every method is safe to call from
several threads at once.

Errors (all subclasses of :class:`StorageError`):

* :class:`NotFound` - the key (or the bucket/container) does not exist.
* :class:`AlreadyExists` - a create-only write met an existing object.
* :class:`TransientError` - worth retrying (throttling, 5xx, connection reset, timeout).
* :class:`PermanentError` - retrying cannot help until an operator acts (access denied,
  missing bucket, bad endpoint); ``str(err)`` names the cause and the fix.
* :class:`DestinationRejected` - a :class:`PermanentError` from ``check()`` when config forbids
  the destination (region outside ``destination.allowed_regions``): the daemon exits 2.
* :class:`ChecksumMismatch` - the store (or a download) saw bytes whose checksum differs.
* :class:`Cancelled` - raised by a ``progress`` callback to abandon a transfer; the backend
  re-raises it after cleaning up.
"""

from __future__ import annotations

import abc
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

__all__ = [
    "AlreadyExists",
    "Backend",
    "Cancelled",
    "ChecksumMismatch",
    "DestinationRejected",
    "NotFound",
    "ObjectInfo",
    "PermanentError",
    "Progress",
    "StorageError",
    "TransientError",
]

Progress = Callable[[int], None]
"""Called with the number of bytes just transferred; may raise :class:`Cancelled`."""


class StorageError(Exception):
    """Base of every error a backend raises."""


class NotFound(StorageError):
    """The object, bucket or container does not exist."""


class AlreadyExists(StorageError):
    """A create-only write found an object already at the key."""


class TransientError(StorageError):
    """A failure that a retry with backoff may cure."""


class PermanentError(StorageError):
    """A failure no retry cures; the message names the cause and the fix."""


class DestinationRejected(PermanentError):
    """The destination's settings are wrong (a profile that does not exist, an endpoint or
    region the SDK refuses, malformed or missing credentials settings) or forbid it (a region
    outside ``destination.allowed_regions``); every command exits 2 with this message."""


class ChecksumMismatch(StorageError):
    """Bytes did not match their checksum."""


class Cancelled(StorageError):
    """The transfer was abandoned on request; nothing visible was left behind."""


@dataclass(frozen=True)
class ObjectInfo:
    """What the store knows of one object.

    ``crc32c`` is the base64 of the big-endian CRC32C of the whole object (the form S3 and
    GCS print), or ``None`` when the store does not report one (then only a read can verify).
    ``mtime`` is the store's own clock, seconds since the epoch.
    """

    key: str
    size: int
    crc32c: str | None = None
    mtime: float | None = None


class Backend(abc.ABC):
    """A destination: a bucket/container prefix or a mounted folder.

    Guarantees every backend gives:

    * ``put_file`` and ``copy`` are atomic: readers see the whole new object or the old one,
      never a part; an interrupted or cancelled put leaves no object at the key.
    * ``put_bytes(create_only=True)`` succeeds for exactly one writer; others get
      :class:`AlreadyExists` and the object is unchanged.
    * ``list`` returns every object under the prefix whose put completed before the call.
    """

    #: short name for logs and metrics labels ("file", "s3", ...)
    scheme: str = "base"
    #: ``list`` reports each object's CRC32C where ``head`` does (GCS; Azure but for blobs
    #: under a customer-provided key), so a check of many objects can list once instead of
    #: asking for each; S3's listings carry none
    lists_crc32c: bool = False

    @property
    @abc.abstractmethod
    def url(self) -> str:
        """The destination URL, without credentials."""

    @abc.abstractmethod
    def put_file(self, key: str, path: Path, *, progress: Progress | None = None) -> ObjectInfo:
        """Stream ``path`` to ``key`` (in parts where the store has them), overwriting.

        The CRC32C is computed in the same pass as the upload and sent so that the store
        verifies it where the store can. Returns the info of what was read and stored.
        Raises ``OSError`` when the local file cannot be read, :class:`Cancelled` when
        ``progress`` raised it, or a :class:`StorageError`.
        """

    @abc.abstractmethod
    def put_bytes(self, key: str, data: bytes, *, create_only: bool = False) -> ObjectInfo:
        """Store a small object. With ``create_only`` raise :class:`AlreadyExists` if present."""

    @abc.abstractmethod
    def get_file(self, key: str, path: Path, *, progress: Progress | None = None) -> ObjectInfo:
        """Download ``key`` into ``path`` (created or replaced), streaming.

        Returns the info with ``crc32c`` computed from the bytes actually written.
        Raises :class:`NotFound` when absent.
        """

    @abc.abstractmethod
    def get_bytes(self, key: str) -> bytes:
        """Read a small object whole. Raises :class:`NotFound` when absent."""

    @abc.abstractmethod
    def head(self, key: str) -> ObjectInfo:
        """Size and, where the store reports it, CRC32C. Raises :class:`NotFound`."""

    @abc.abstractmethod
    def list(self, prefix: str = "") -> Iterator[ObjectInfo]:
        """Every object whose key starts with ``prefix`` (a plain string prefix), any order."""

    @abc.abstractmethod
    def delete(self, key: str) -> None:
        """Remove ``key``. Deleting a missing key is not an error."""

    @abc.abstractmethod
    def copy(self, src: str, dst: str) -> ObjectInfo:
        """Server-side copy; no bytes pass through this process where the store allows.

        Raises :class:`NotFound` when ``src`` is absent; callers fall back to an upload on
        any :class:`StorageError`.
        """

    def check(self) -> None:  # noqa: B027 - optional hook
        """Verify at start that the destination is usable; raise :class:`PermanentError`.

        The default does nothing; backends check bucket existence, region and access.
        """

    def cleanup_stale(self, older_than_seconds: float) -> int:
        """Remove abandoned partial uploads older than the age, by the store's clock.

        Returns how many were removed. The default has nothing to clean.
        """
        return 0

    def close(self) -> None:  # noqa: B027 - optional hook
        """Release connections and threads. Safe to call twice."""
