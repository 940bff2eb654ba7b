"""A download during which its object is replaced: the check shared by every store that
downloads in ranges (S3, GCS, Azure)."""

from __future__ import annotations

from pathlib import Path

import pytest

from sidecar.storage.base import Backend, TransientError


def assert_a_replacement_midway_fails_the_download(
    backend: Backend, key: str, dest: Path, match: str
) -> None:
    """Download ``key`` into ``dest`` and replace the object as soon as the first bytes
    arrive. The download must fail with a :class:`TransientError` (tried again later)
    whose message matches ``match``, and leave no file holding bytes of two versions."""
    replaced = False

    def replace_once(_: int) -> None:
        nonlocal replaced
        if not replaced:
            replaced = True
            backend.put_bytes(key, b"a new version")

    with pytest.raises(TransientError, match=match):
        backend.get_file(key, dest, progress=replace_once)
    assert replaced
    assert not dest.exists()
