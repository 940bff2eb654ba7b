"""Both Azure URL forms and every way of naming the account and credential, against Azurite."""

from __future__ import annotations

import base64
from collections.abc import Iterator
from pathlib import Path

import pytest

from sidecar.config import DestinationConfig
from sidecar.storage.azure import AzureBackend, create
from sidecar.storage.base import Backend, DestinationRejected, PermanentError
from sidecar.storage.options import AzureOptions
from sidecar.storage.registry import open_backend
from sidecar.storage.url import parse_destination
from tests.servers.azurite import ACCOUNT, KEY, Azurite

_AZURE_ENV = (
    "AZURE_STORAGE_CONNECTION_STRING",
    "AZURE_STORAGE_ACCOUNT",
    "AZURE_STORAGE_KEY",
    "AZURE_STORAGE_SAS_TOKEN",
)


@pytest.fixture(autouse=True)
def clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in _AZURE_ENV:
        monkeypatch.delenv(name, raising=False)


@pytest.fixture
def container(azurite: Azurite) -> Iterator[str]:
    name = azurite.new_container()
    yield name
    azurite.delete_container(name)


def _round_trip(backend: Backend, azurite: Azurite, container: str, blob_name: str) -> None:
    backend.check()
    backend.put_bytes("step-1/model.pt", b"weights")
    assert backend.get_bytes("step-1/model.pt") == b"weights"
    assert [o.key for o in backend.list("")] == ["step-1/model.pt"]
    with azurite.service() as service:
        names = [b.name for b in service.get_container_client(container).list_blobs()]
    assert names == [blob_name]  # the URL's prefix is where the object really lands
    backend.close()


def test_az_url_with_account_from_environment(
    azurite: Azurite, container: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("AZURE_STORAGE_ACCOUNT", ACCOUNT)
    monkeypatch.setenv("AZURE_STORAGE_KEY", KEY)
    url = f"az://{container}/team/run-7"
    dest = DestinationConfig(url=url, azure=AzureOptions(account_url=azurite.account_url))
    backend = open_backend(dest)
    assert isinstance(backend, AzureBackend) and backend.url == url
    assert backend.account == ACCOUNT
    _round_trip(backend, azurite, container, "team/run-7/step-1/model.pt")


def test_https_url_names_the_account(azurite: Azurite, container: str) -> None:
    url = f"https://{ACCOUNT}.blob.core.windows.net/{container}/run-8"
    # account_url points the named account at Azurite instead of the public endpoint
    backend = open_backend(azurite.destination(url))
    assert isinstance(backend, AzureBackend) and backend.account == ACCOUNT
    _round_trip(backend, azurite, container, "run-8/step-1/model.pt")


def test_connection_string_from_environment(
    azurite: Azurite, container: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("AZURE_STORAGE_CONNECTION_STRING", azurite.connection_string)
    backend = open_backend(DestinationConfig(url=f"az://{container}"))
    _round_trip(backend, azurite, container, "step-1/model.pt")


def test_connection_string_for_another_account_is_refused(azurite: Azurite) -> None:
    url = "https://otheraccount.blob.core.windows.net/ckpt/run"
    dest = DestinationConfig(
        url=url,
        azure=AzureOptions(connection_string=azurite.connection_string),  # type: ignore[arg-type]
    )
    with pytest.raises(PermanentError, match="'devstoreaccount1' but the destination names"):
        create(parse_destination(url), dest)


def test_az_url_without_account_says_how_to_name_it() -> None:
    dest = DestinationConfig(url="az://ckpt/run")
    with pytest.raises(PermanentError, match="AZURE_STORAGE_ACCOUNT"):
        open_backend(dest)


def test_no_credential_without_azure_identity_names_the_extra() -> None:
    dest = DestinationConfig(url="az://ckpt/run", azure=AzureOptions(account="acct"))
    with pytest.raises(PermanentError, match=r"ckpt-sidecar\[azure-identity\]"):
        open_backend(dest)


def test_customer_key_needs_https(azurite: Azurite) -> None:
    key = base64.b64encode(b"k" * 32).decode()
    with pytest.raises(PermanentError, match="needs an https endpoint"):
        open_backend(azurite.destination("az://ckpt/run", customer_provided_key=key))
    with pytest.raises(PermanentError, match="32-byte"):
        open_backend(azurite.destination("az://ckpt/run", customer_provided_key="c2hvcnQ="))


def test_allowed_regions_need_the_stated_region(azurite: Azurite, container: str) -> None:
    url = f"az://{container}/run"
    unstated = azurite.destination(url).model_copy(update={"allowed_regions": ["westeurope"]})
    with pytest.raises(DestinationRejected, match=r"destination\.azure\.region"):
        open_backend(unstated).check()
    outside = azurite.destination(url, region="eastus").model_copy(
        update={"allowed_regions": ["westeurope"]}
    )
    with pytest.raises(DestinationRejected, match="eastus"):
        open_backend(outside).check()
    inside = azurite.destination(url, region="westeurope").model_copy(
        update={"allowed_regions": ["westeurope"]}
    )
    open_backend(inside).check()


def test_access_tier_is_applied(azurite: Azurite, container: str, tmp_path: Path) -> None:
    backend = open_backend(azurite.destination(f"az://{container}/run", access_tier="Cool"))
    (tmp_path / "m.pt").write_bytes(b"weights")
    backend.put_file("m.pt", tmp_path / "m.pt")
    with azurite.service() as service:
        props = service.get_blob_client(container, "run/m.pt").get_blob_properties()
    assert props.blob_tier == "Cool"
