"""GCS downloads through the look-alike: a broken reply is started over and counted once,
refusals (the store's, or a token that cannot be had) are told apart, and the bytes
written are the object's."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from google.auth.credentials import AnonymousCredentials
from google.auth.exceptions import RefreshError

from sidecar.storage import gcs_resumable
from sidecar.storage.base import PermanentError, TransientError
from sidecar.storage.checksum import crc32c_of_bytes
from tests.servers.gcs import GcsRecorder, gcs_backend

MiB = 1024 * 1024


@pytest.fixture(autouse=True)
def _no_pauses(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(gcs_resumable, "RETRY_PAUSES", (0.0, 0.0, 0.0))


@pytest.fixture
def stored(gcs_recorder: GcsRecorder) -> bytes:
    data = os.urandom(3 * MiB + 5)
    gcs_recorder.objects["run/model.pt"] = data
    return data


def test_a_reply_cut_midway_is_started_over_and_counted_once(
    gcs_recorder: GcsRecorder, stored: bytes, tmp_path: Path
) -> None:
    gcs_recorder.fail("GET", "alt=media", cut=2 * MiB + 3)
    backend = gcs_backend(gcs_recorder.url, "b", "run")
    seen: list[int] = []
    info = backend.get_file("model.pt", tmp_path / "model.pt", progress=seen.append)
    assert (tmp_path / "model.pt").read_bytes() == stored
    assert info.size == len(stored) and info.crc32c == crc32c_of_bytes(stored)
    assert sum(seen) == len(stored)  # the 2 MiB of the broken reply are not counted again
    assert len(gcs_recorder.seen("GET", "alt=media")) == 2
    backend.close()


def test_an_outage_outlasting_the_retries_is_transient(
    gcs_recorder: GcsRecorder, stored: bytes, tmp_path: Path
) -> None:
    gcs_recorder.fail("GET", "alt=media", 503, times=4)
    backend = gcs_backend(gcs_recorder.url, "b", "run")
    with pytest.raises(TransientError, match=r"gs://b/run/model\.pt"):
        backend.get_file("model.pt", tmp_path / "model.pt")
    assert not (tmp_path / "model.pt").exists()
    assert len(gcs_recorder.seen("GET", "alt=media")) == 4  # one, then three retries
    backend.close()


def test_a_connection_dropped_on_every_attempt_is_transient(
    gcs_recorder: GcsRecorder, stored: bytes, tmp_path: Path
) -> None:
    gcs_recorder.fail("GET", "alt=media", drop=True, times=2)
    gcs_recorder.fail("GET", "alt=media", cut=MiB + 1, times=2)  # mid-body: urllib3's error
    backend = gcs_backend(gcs_recorder.url, "b", "run")
    with pytest.raises(TransientError, match=r"GCS download gs://b/run/model\.pt: connection"):
        backend.get_file("model.pt", tmp_path / "model.pt")
    assert not (tmp_path / "model.pt").exists()
    assert len(gcs_recorder.seen("GET", "alt=media")) == 4
    backend.close()


def test_access_denied_is_permanent_and_not_retried(
    gcs_recorder: GcsRecorder, stored: bytes, tmp_path: Path
) -> None:
    gcs_recorder.fail("GET", "alt=media", 403, body='{"error": {"message": "no access"}}')
    backend = gcs_backend(gcs_recorder.url, "b", "run")
    with pytest.raises(PermanentError, match="access denied"):
        backend.get_file("model.pt", tmp_path / "model.pt")
    assert not (tmp_path / "model.pt").exists()
    assert len(gcs_recorder.seen("GET", "alt=media")) == 1
    backend.close()


class _RevokedCredentials(AnonymousCredentials):
    """Credentials whose token can no longer be refreshed (a revoked service-account key)."""

    def before_request(self, *args: object, **kwargs: object) -> None:
        raise RefreshError(  # type: ignore[no-untyped-call]
            "invalid_grant: Token has been expired or revoked.", retryable=False
        )


def test_a_token_that_cannot_be_refreshed_is_permanent_and_names_the_fix(
    gcs_recorder: GcsRecorder, stored: bytes, tmp_path: Path
) -> None:
    backend = gcs_backend(gcs_recorder.url, "b", "run")
    backend._http.credentials = _RevokedCredentials()  # type: ignore[no-untyped-call]
    with pytest.raises(PermanentError, match=r"could not get an access token.*credentials_file"):
        backend.get_file("model.pt", tmp_path / "model.pt")
    assert not (tmp_path / "model.pt").exists()
    assert gcs_recorder.seen("GET", "alt=media") == []  # nothing was sent without a token
    backend.close()
