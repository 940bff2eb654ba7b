"""Azure failures an operator meets, against Azurite: one clear line, the right error class."""

from __future__ import annotations

import base64
import socket
from pathlib import Path

import pytest
from azure.storage.blob import BlobServiceClient

from sidecar.storage.azure import AzureBackend, create
from sidecar.storage.base import PermanentError, TransientError
from sidecar.storage.options import AzureOptions
from sidecar.storage.url import parse_destination
from tests.servers.azurite import ACCOUNT, Azurite

WRONG_KEY = base64.b64encode(b"not the account key, 64 bytes long........................").decode()
SECRET_SIG = "sig=THISISASECRETSIGNATURE1234567890abcdef%3D"


def _backend(azurite: Azurite, url: str, **opts: object) -> AzureBackend:
    dest = azurite.destination(url, **opts)
    backend = create(parse_destination(dest.url), dest)
    assert isinstance(backend, AzureBackend)
    return backend


def _one_line(err: BaseException) -> str:
    text = str(err)
    assert "\n" not in text
    return text


def test_wrong_account_key(azurite: Azurite, tmp_path: Path) -> None:
    container = azurite.new_container()
    backend = _backend(azurite, f"az://{container}/run", account_key=WRONG_KEY)
    with pytest.raises(PermanentError) as check:
        backend.check()
    text = _one_line(check.value)
    assert "access check" in text
    assert f"account '{ACCOUNT}'" in text and f"container '{container}'" in text
    assert "403" in text and "credentials" in text
    assert WRONG_KEY not in text
    (tmp_path / "m.pt").write_bytes(b"weights")
    with pytest.raises(PermanentError, match=r"upload of 'm\.pt'"):
        backend.put_file("m.pt", tmp_path / "m.pt")
    azurite.delete_container(container)


def test_bad_sas_token_is_refused_and_never_printed(azurite: Azurite) -> None:
    container = azurite.new_container()
    sas = f"sv=2021-08-06&ss=b&srt=sco&sp=rwdlac&se=2030-01-01T00:00:00Z&{SECRET_SIG}"
    backend = _backend(azurite, f"az://{container}/run", account_key=None, sas_token=sas)
    with pytest.raises(PermanentError) as err:
        backend.put_bytes("x.json", b"{}")
    text = _one_line(err.value)
    assert "write of 'x.json'" in text and "403" in text
    assert "THISISASECRET" not in text
    azurite.delete_container(container)


def test_missing_container(azurite: Azurite, tmp_path: Path) -> None:
    backend = _backend(azurite, "az://no-such-container/run")
    with pytest.raises(PermanentError) as check:
        backend.check()
    text = _one_line(check.value)
    assert "container 'no-such-container'" in text and "does not exist" in text
    assert f"az storage container create --account-name {ACCOUNT} --name no-such-container" in text
    (tmp_path / "m.pt").write_bytes(b"weights")
    # not NotFound: restore must not read a missing container as "no checkpoint yet"
    with pytest.raises(PermanentError, match="does not exist"):
        backend.put_file("m.pt", tmp_path / "m.pt")
    with pytest.raises(PermanentError, match="does not exist"):
        backend.head(".ckpt-sidecar/LATEST")
    with pytest.raises(PermanentError, match="does not exist"):
        list(backend.list(".ckpt-sidecar/manifests/"))


def test_unreachable_endpoint_is_transient_and_hides_the_sas(tmp_path: Path) -> None:
    with socket.socket() as s:  # a loopback port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    sas = f"sv=2021-08-06&{SECRET_SIG}"
    service = BlobServiceClient(f"http://127.0.0.1:{port}/{ACCOUNT}", credential=sas, retry_total=0)
    backend = AzureBackend(
        service.get_container_client("ckpt"), "run", AzureOptions(), account=ACCOUNT
    )
    (tmp_path / "m.pt").write_bytes(b"weights")
    with pytest.raises(TransientError) as err:
        backend.put_file("m.pt", tmp_path / "m.pt")
    text = _one_line(err.value)
    assert "could not be reached" in text
    assert "THISISASECRET" not in text
    assert err.value.__cause__ is None and err.value.__suppress_context__
    # At start-up it is a setting to fix (reported on /readyz), as on S3 and GCS.
    with pytest.raises(PermanentError) as at_start:
        backend.check()
    text = _one_line(at_start.value)
    assert "could not be reached" in text and "destination.url" in text
    assert "THISISASECRET" not in text
