"""Destination settings the SDK refuses are bad configuration: exit 2, naming the key."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import structlog

from sidecar import cli


@pytest.fixture(autouse=True)
def _logging_as_before() -> Iterator[None]:
    """``cli.main`` points the logs at this test's captured stderr; later tests need them back."""
    yield
    structlog.reset_defaults()


def test_an_s3_profile_that_does_not_exist_exits_2(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("AWS_PROFILE", "no-such-profile-7c1")
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "none"))
    assert cli.main(["list", "--destination", "s3://bucket/run"]) == 2
    assert "destination.s3.profile" in capsys.readouterr().err


def test_a_malformed_azure_connection_string_exits_2(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("AZURE_STORAGE_CONNECTION_STRING", "not a connection string")
    assert cli.main(["list", "--destination", "az://ckpt/run"]) == 2
    assert "connection string is malformed" in capsys.readouterr().err
