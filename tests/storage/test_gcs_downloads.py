"""GCS downloads through the look-alike: a broken reply is started over and counted once,
refusals (the store's, or a token that cannot be had) are told apart, and the bytes
written are the object's."""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest
from google.auth.credentials import AnonymousCredentials
from google.auth.exceptions import RefreshError

from sidecar.storage import gcs_resumable
from sidecar.storage.base import PermanentError, TransientError
from sidecar.storage.checksum import crc32c_of_bytes
from tests.servers.gcs import GcsRecorder, GcsServer, gcs_backend, gcs_proxy
from tests.storage.replaced import assert_a_replacement_midway_fails_the_download

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


# -- sliced downloads: an object larger than xml_part_size_bytes comes in ranges ------------


def test_a_large_object_comes_down_in_ranges_of_its_generation(
    fake_gcs_server: GcsServer, tmp_path: Path
) -> None:
    """fake-gcs-server names the generation in its reply, as GCS does: the first GET's
    reply is read for the first 5 MiB range only, and every other range is a GET of that
    generation."""
    bucket = fake_gcs_server.new_bucket("ranges")
    with gcs_proxy(fake_gcs_server) as proxy:
        backend = gcs_backend(proxy.url, bucket, "run", xml_part_size_bytes=5 * MiB)
        data = os.urandom(2 * 5 * MiB + 7)
        src = tmp_path / "model.pt"
        src.write_bytes(data)
        backend.put_file("model.pt", src)
        seen: list[int] = []
        info = backend.get_file("model.pt", tmp_path / "back.pt", progress=seen.append)
        backend.close()
    assert (tmp_path / "back.pt").read_bytes() == data
    assert info.size == len(data) and info.crc32c == crc32c_of_bytes(data)
    assert sum(seen) == len(data)
    media = [(p, r) for p, r in proxy.gets if "alt=media" in p]
    assert media[0][1] == "" and "generation=" not in media[0][0]
    generations = {re.search(r"generation=(\d+)", p)[1] for p, _ in media[1:]}  # type: ignore[index]
    assert len(generations) == 1
    assert len(media) == 3
    assert {r for _, r in media[1:]} == {
        f"bytes={5 * MiB}-{10 * MiB - 1}",
        f"bytes={10 * MiB}-{10 * MiB + 6}",
    }


def test_an_object_replaced_during_a_sliced_download_fails_it(
    fake_gcs_server: GcsServer, tmp_path: Path
) -> None:
    """One range at a time: the object is replaced after the first piece arrives, and the
    second range finds its generation gone (fake-gcs-server answers 404, as GCS does without
    object versioning); that range is not asked again, and nothing of the two versions is
    left mixed in a file."""
    with gcs_proxy(fake_gcs_server) as proxy:
        backend = gcs_backend(
            proxy.url,
            fake_gcs_server.new_bucket("replaced"),
            "run",
            xml_part_size_bytes=5 * MiB,
            part_concurrency=1,
        )
        src = tmp_path / "model.pt"
        src.write_bytes(os.urandom(2 * 5 * MiB))
        backend.put_file("model.pt", src)
        assert_a_replacement_midway_fails_the_download(
            backend, "model.pt", tmp_path / "back.pt", match="replaced or deleted during"
        )
        backend.close()
    assert proxy.statuses("GET", "alt=media") == [200, 404]  # the first GET, then one range


@pytest.mark.parametrize(
    ("broken", "asked"),
    [
        (  # the first GET, read for the first range
            r"alt=media$",
            [f"bytes={MiB + 3}-{5 * MiB - 1}", f"bytes={5 * MiB}-{10 * MiB - 1}"],
        ),
        (  # a ranged GET of the generation
            r"generation=1",
            [f"bytes={5 * MiB}-{10 * MiB - 1}", f"bytes={6 * MiB + 3}-{10 * MiB - 1}"],
        ),
    ],
)
def test_a_range_cut_midway_goes_on_from_where_it_broke(
    gcs_recorder: GcsRecorder, tmp_path: Path, broken: str, asked: list[str]
) -> None:
    data = os.urandom(2 * 5 * MiB + 5)
    gcs_recorder.objects["run/model.pt"] = data
    gcs_recorder.fail("GET", broken, cut=MiB + 3)  # the reply breaks after MiB + 3 bytes
    backend = gcs_backend(
        gcs_recorder.url, "b", "run", xml_part_size_bytes=5 * MiB, part_concurrency=1
    )
    seen: list[int] = []
    info = backend.get_file("model.pt", tmp_path / "model.pt", progress=seen.append)
    backend.close()
    assert (tmp_path / "model.pt").read_bytes() == data
    assert info.crc32c == crc32c_of_bytes(data) and sum(seen) == len(data)
    ranged = [r.headers.get("range") for r in gcs_recorder.seen("GET", "generation=1")]
    # the bytes already written are not asked again; the last range comes as usual
    assert ranged == [*asked, f"bytes={10 * MiB}-{10 * MiB + 4}"]


def test_a_range_failing_on_every_attempt_fails_the_download(
    gcs_recorder: GcsRecorder, tmp_path: Path
) -> None:
    gcs_recorder.objects["run/model.pt"] = os.urandom(2 * 5 * MiB)
    gcs_recorder.fail("GET", "generation=1", 503, times=4)
    backend = gcs_backend(
        gcs_recorder.url, "b", "run", xml_part_size_bytes=5 * MiB, part_concurrency=1
    )
    with pytest.raises(TransientError, match=r"gs://b/run/model\.pt"):
        backend.get_file("model.pt", tmp_path / "model.pt")
    backend.close()
    assert not (tmp_path / "model.pt").exists()
    second = [
        r
        for r in gcs_recorder.seen("GET", "generation=1")
        if r.headers["range"] == f"bytes={5 * MiB}-{10 * MiB - 1}"
    ]
    assert len(second) == 4  # one, then three retries
