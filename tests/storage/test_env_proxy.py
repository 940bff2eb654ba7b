"""The Azure and GCS clients honour the environment's proxy variables (read once, when the
backend is built): through a real forwarding proxy in front of Azurite and a GCS emulator."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlsplit

import pytest

from sidecar.storage.base import Backend
from sidecar.storage.registry import open_backend
from tests.servers.azurite import Azurite
from tests.servers.forward_proxy import ForwardProxy, forward_proxy
from tests.servers.gcs import GcsServer, gcs_backend

_PROXY_VARS = ("NO_PROXY", "no_proxy", "HTTPS_PROXY", "https_proxy", "http_proxy", "ALL_PROXY")


@pytest.fixture
def proxy(monkeypatch: pytest.MonkeyPatch) -> Iterator[ForwardProxy]:
    for name in _PROXY_VARS:
        monkeypatch.delenv(name, raising=False)
    with forward_proxy() as server:
        monkeypatch.setenv("HTTP_PROXY", server.url)
        yield server


@pytest.fixture(params=["azure", "gcs"])
def store(request: pytest.FixtureRequest) -> Iterator[tuple[str, object]]:
    if request.param == "azure":
        azurite: Azurite = request.getfixturevalue("azurite")
        name = azurite.new_container()
        yield "azure", (azurite, name)
        azurite.delete_container(name)
    else:
        yield "gcs", request.getfixturevalue("fake_gcs_server")


def _origin(store: tuple[str, object]) -> str:
    kind, server = store
    if kind == "azure":
        assert isinstance(server, tuple)
        return str(server[0].account_url)
    assert isinstance(server, GcsServer)
    return server.url


def _backend(store: tuple[str, object]) -> Backend:
    """A backend built now, so it reads the environment now."""
    kind, server = store
    if kind == "azure":
        assert isinstance(server, tuple)
        azurite, container = server
        return open_backend(azurite.destination(f"az://{container}/run"))
    assert isinstance(server, GcsServer)
    return gcs_backend(server.url, server.new_bucket())


def _round_trip(backend: Backend, tmp_path: Path) -> None:
    src = tmp_path / "model.pt"
    src.write_bytes(b"weights" * 1000)
    backend.put_file("step-1/model.pt", src)
    assert backend.get_bytes("step-1/model.pt") == src.read_bytes()
    backend.close()


def test_requests_go_through_the_http_proxy(
    store: tuple[str, object], proxy: ForwardProxy, tmp_path: Path
) -> None:
    _round_trip(_backend(store), tmp_path)
    assert proxy.seen, "no request went through HTTP_PROXY"
    assert all(s.split(" ", 1)[1].startswith(_origin(store)) for s in proxy.seen), proxy.seen
    assert any(s.startswith(("PUT ", "POST ")) for s in proxy.seen), proxy.seen


def test_a_no_proxy_host_is_reached_directly(
    store: tuple[str, object],
    proxy: ForwardProxy,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("NO_PROXY", urlsplit(_origin(store)).hostname or "")
    _round_trip(_backend(store), tmp_path)
    assert proxy.seen == []
