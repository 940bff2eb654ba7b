"""The daemon and restore end to end against each real local store."""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING

from tests.e2e.harness import Daemon, checkpoint_is, cli, same_tree, write_atomic

if TYPE_CHECKING:
    from tests.servers.azurite import Azurite
    from tests.servers.gcs import GcsServer
    from tests.servers.seaweedfs import S3Server


def round_trip(
    watch: Path,
    url: str,
    env: dict[str, str],
    tmp_path: Path,
    daemons: list[Daemon],
    secret: str | None = None,
) -> None:
    """Commit three checkpoints (one reusing a file: server-side copy), drain, restore, verify."""
    d = Daemon(watch, url, env=env)
    daemons.append(d)
    d.wait_for("daemon.ready", timeout=60)
    config = os.urandom(3000)
    for step in (1, 3):
        tmp = watch / f"step_{step}.partial"
        tmp.mkdir()
        (tmp / "config.json").write_bytes(config)  # unchanged between the two
        (tmp / "weights.bin").write_bytes(os.urandom(9 * 1024 * 1024 + step))
        os.replace(tmp, watch / f"step_{step}")
        if step == 1:
            write_atomic(watch / "step_2.pt", os.urandom(100_000))
            d.wait_for("checkpoint.committed", timeout=120, where=checkpoint_is("step_2.pt"))
        d.wait_for("checkpoint.committed", timeout=120, where=checkpoint_is(f"step_{step}"))
    third = d.wait_for("checkpoint.committed", where=checkpoint_is("step_3"))
    assert third["copied_files"] == 1, "config.json is copied server-side, not uploaded"
    assert d.terminate() == 0
    if secret:
        assert not any(secret in line for line in d.raw), "a secret reached the logs"

    base = ["--destination", url]
    r = cli("list", "--json", *base, env=env)
    assert r.returncode == 0, r.stderr
    assert r.stdout.count('"name"') == 3
    r = cli("verify", "--all", "--deep", *base, env=env)
    assert r.returncode == 0, r.stdout + r.stderr
    target = tmp_path / "restored"
    r = cli("restore", "--to", str(target), *base, env=env)
    assert r.returncode == 0, r.stderr
    assert same_tree(watch / "step_3", target / "step_3")
    if secret:
        assert secret not in r.stdout + r.stderr


def test_azure_az_url(
    dirs: tuple[Path, Path], daemons: list[Daemon], tmp_path: Path, azurite: Azurite
) -> None:
    from tests.servers.azurite import KEY

    watch, _ = dirs
    env = {
        "CKPT_SIDECAR_DESTINATION__AZURE__ACCOUNT_URL": azurite.account_url,
        "CKPT_SIDECAR_DESTINATION__AZURE__ACCOUNT_KEY": KEY,
    }
    url = f"az://{azurite.new_container()}/run-1/node-0"
    round_trip(watch, url, env, tmp_path, daemons, secret=KEY)


def test_azure_https_url(
    dirs: tuple[Path, Path], daemons: list[Daemon], tmp_path: Path, azurite: Azurite
) -> None:
    watch, _ = dirs
    env = {"AZURE_STORAGE_CONNECTION_STRING": azurite.connection_string}
    url = f"https://devstoreaccount1.blob.core.windows.net/{azurite.new_container()}/run-2"
    env["CKPT_SIDECAR_DESTINATION__AZURE__ACCOUNT_URL"] = azurite.account_url
    round_trip(watch, url, env, tmp_path, daemons)


def test_gcs_on_gcp_storage_emulator(
    dirs: tuple[Path, Path], daemons: list[Daemon], tmp_path: Path, gcs_emulator: GcsServer
) -> None:
    watch, _ = dirs
    url = f"gs://{gcs_emulator.new_bucket()}/job-1/node-0"
    round_trip(watch, url, {"STORAGE_EMULATOR_HOST": gcs_emulator.url}, tmp_path, daemons)


def test_gcs_on_fake_gcs_server(
    dirs: tuple[Path, Path], daemons: list[Daemon], tmp_path: Path, fake_gcs_server: GcsServer
) -> None:
    watch, _ = dirs
    url = f"gs://{fake_gcs_server.new_bucket()}/job-1"
    round_trip(watch, url, {"STORAGE_EMULATOR_HOST": fake_gcs_server.url}, tmp_path, daemons)


def test_s3_on_seaweedfs_with_only_aws_environment(
    dirs: tuple[Path, Path], daemons: list[Daemon], tmp_path: Path, s3_server: S3Server
) -> None:
    """An S3-compatible store needs no config file: the standard AWS_* variables suffice."""
    from tests.servers.seaweedfs import new_bucket

    watch, _ = dirs
    url = f"s3://{new_bucket(s3_server, 'e2e')}/run-1/node-0"
    round_trip(watch, url, s3_server.env(), tmp_path, daemons, secret=s3_server.secret_key)


def test_bucket_outside_allowed_regions_exits_2_before_watching(
    dirs: tuple[Path, Path], daemons: list[Daemon], s3_server: S3Server
) -> None:
    from tests.servers.seaweedfs import new_bucket

    watch, _ = dirs
    write_atomic(watch / "step_1.pt", os.urandom(1024))
    d = Daemon(
        watch,
        f"s3://{new_bucket(s3_server, 'e2e')}/run-1",
        env={**s3_server.env(), "CKPT_SIDECAR_DESTINATION__ALLOWED_REGIONS": "ca-central-1"},
    )
    daemons.append(d)
    assert d.proc.wait(timeout=60) == 2
    d.close()
    text = "".join(d.raw)
    assert s3_server.region in text and "ca-central-1" in text, text
    assert d.named("daemon.ready") == [] and d.named("checkpoint.ready") == []
    assert d.named("daemon.stopped") == []  # no exit status logged other than the real one
