"""`list`, `verify` and `restore` print names from the store with control characters escaped
(a name holding an escape sequence must not drive the operator's terminal)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import structlog

from sidecar import cli
from sidecar.storage.local import LocalBackend
from tests.unit.test_commit import Rig, ready

NAME = "step_\x1b]0;owned\x07_1.pt"


@pytest.fixture(autouse=True)
def _logging_as_before() -> Iterator[None]:
    """``cli.main`` points the logs at this test's captured stderr; later tests need them back."""
    yield
    structlog.reset_defaults()


@pytest.fixture
def remote(tmp_path: Path) -> str:
    src = tmp_path / "src"
    src.mkdir()
    (src / NAME).write_bytes(b"weights")
    rig = Rig(LocalBackend(tmp_path / "remote"))
    try:
        rig.commit(ready(src, NAME))
    finally:
        rig.close()
    return f"file://{tmp_path / 'remote'}"


@pytest.mark.parametrize("command", [["list"], ["verify", "--all"], ["restore", "--to", "R"]])
def test_names_are_printed_escaped(
    tmp_path: Path,
    remote: str,
    command: list[str],
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("COLUMNS", "400")  # the table shows whole names
    argv = [str(tmp_path / a) if a == "R" else a for a in command]
    assert cli.main([*argv, "--destination", remote]) == 0
    out = capsys.readouterr()
    printed = out.out + out.err
    assert "\x1b" not in printed and "\x07" not in printed
    assert "\\x1b]0;owned\\x07" in printed
