"""The public CLI: subcommands, and bad configuration exiting 2 with the key named."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from tests.e2e.harness import cli


def test_help_lists_the_subcommands() -> None:
    r = cli("--help")
    assert r.returncode == 0
    for cmd in ("run", "restore", "list", "verify", "config", "drain"):
        assert cmd in r.stdout
    r = cli("restore", "--help")
    for flag in (
        "--to",
        "--checkpoint",
        "--allow-empty",
        "--force",
        "--deep",
        "--destination",
        "--config",
    ):
        assert flag in r.stdout


def test_config_prints_effective_config_with_secrets_redacted(tmp_path: Path) -> None:
    cfg = tmp_path / "c.yaml"
    cfg.write_text("admin:\n  token: s3cr3t-token\nwatch:\n  path: /data/ckpt\n")
    r = cli("config", "--config", str(cfg), env={"CKPT_SIDECAR_UPLOAD__CONCURRENCY": "7"})
    assert r.returncode == 0, r.stderr
    assert "s3cr3t-token" not in r.stdout and "***" in r.stdout
    assert "/data/ckpt" in r.stdout and "concurrency: 7" in r.stdout
    r = cli("config", "--config", str(cfg), "--watch", "/flag/wins")
    assert "/flag/wins" in r.stdout
    assert cli("config", "--check", "--config", str(cfg)).returncode == 0


def test_example_config_is_valid_and_documents_every_key() -> None:
    from sidecar.config import Config

    example = Path(__file__).parents[2] / "config.example.yaml"
    assert cli("config", "--check", "--config", str(example)).returncode == 0
    import yaml

    doc = yaml.safe_load(example.read_text())

    def walk(model: type, node: dict[str, object], where: str) -> None:
        from pydantic import BaseModel

        for name, field in model.model_fields.items():  # type: ignore[attr-defined]
            assert name in node, f"config.example.yaml does not document {where}{name}"
            ann = field.annotation
            if isinstance(ann, type) and issubclass(ann, BaseModel) and node[name]:
                sub = node[name]
                assert isinstance(sub, dict)
                walk(ann, sub, f"{where}{name}.")

    walk(Config, doc, "")


BAD = [
    ("unknown key in a section", {"CKPT_SIDECAR_WATCH__PATHH": "/x"}, [], "watch.pathh"),
    ("wrong type", {"CKPT_SIDECAR_UPLOAD__CONCURRENCY": "many"}, [], "upload.concurrency"),
    ("negative size", {"CKPT_SIDECAR_UPLOAD__PART_SIZE_BYTES": "-5"}, [], "upload.part_size_bytes"),
    ("keep_last below 2", {"CKPT_SIDECAR_RETENTION__KEEP_LAST": "1"}, [], "retention.keep_last"),
    ("unknown layout", {"CKPT_SIDECAR_CHECKPOINT__LAYOUT": "keras"}, [], "checkpoint.layout"),
    ("unknown scheme", {}, ["--destination", "ftp://host/x"], "destination.url"),
    ("invalid bucket", {}, ["--destination", "s3://Bad_Bucket!/x"], "destination.url"),
    (
        "credentials in the URL",
        {},
        ["--destination", "s3://AKIAX:hunter2@bucket/x"],
        "must not carry credentials",
    ),
    (
        "invalid step regex",
        {"CKPT_SIDECAR_CHECKPOINT__STEP_REGEX": "step(("},
        [],
        "checkpoint.step_regex",
    ),
    (
        "marker layout without marker",
        {"CKPT_SIDECAR_CHECKPOINT__LAYOUT": "marker"},
        [],
        "checkpoint.marker",
    ),
    ("bad watch mode", {"CKPT_SIDECAR_WATCH__MODE": "fanotify"}, [], "watch.mode"),
    ("admin port out of range", {"CKPT_SIDECAR_ADMIN__PORT": "70000"}, [], "admin.port"),
    (
        "bad preemption source",
        {"CKPT_SIDECAR_PREEMPTION__SOURCE": "oracle"},
        [],
        "preemption.source",
    ),
    ("unknown section", {"CKPT_SIDECAR_UPLAOD__CONCURRENCY": "2"}, [], "uplaod"),
    ("bad log level", {"CKPT_SIDECAR_LOG__LEVEL": "verbose"}, [], "log.level"),
    (
        "zero settle poll interval",
        {"CKPT_SIDECAR_WATCH__POLL_INTERVAL_SECONDS": "0"},
        [],
        "watch.poll_interval_seconds",
    ),
]


@pytest.mark.parametrize(("case", "env", "flags", "key"), BAD, ids=[b[0] for b in BAD])
def test_bad_config_exits_2_naming_the_key(
    tmp_path: Path, case: str, env: dict[str, str], flags: list[str], key: str
) -> None:
    (tmp_path / "w").mkdir()
    r = cli("run", "--watch", str(tmp_path / "w"), *flags, env=env, cwd=tmp_path)
    assert r.returncode == 2, (case, r.stdout, r.stderr)
    assert key in r.stderr, r.stderr
    assert "hunter2" not in r.stderr
    assert not (tmp_path / ".ckpt-remote").exists()  # nothing started


def test_bad_yaml_and_missing_config_file(tmp_path: Path) -> None:
    r = cli("run", "--config", str(tmp_path / "nope.yaml"))
    assert r.returncode == 2 and "does not exist" in r.stderr
    bad = tmp_path / "bad.yaml"
    bad.write_text("watch: [unclosed\n")
    r = cli("run", "--config", str(bad))
    assert r.returncode == 2 and "not valid YAML" in r.stderr


def test_watch_path_problems_exit_2(tmp_path: Path) -> None:
    r = cli("run", "--watch", str(tmp_path / "missing"), "--destination", f"file://{tmp_path}/r")
    assert r.returncode == 2 and "does not exist" in r.stderr
    f = tmp_path / "file"
    f.write_text("x")
    r = cli("run", "--watch", str(f), "--destination", f"file://{tmp_path}/r")
    assert r.returncode == 2 and "is a file" in r.stderr
    (tmp_path / "w").mkdir()
    r = cli("run", "--watch", str(tmp_path / "w"), "--destination", f"file://{tmp_path}/w/remote")
    assert r.returncode == 2 and "inside watch.path" in r.stderr


def test_admin_port_in_use_exits_2(tmp_path: Path) -> None:
    (tmp_path / "w").mkdir()
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        r = cli(
            "run",
            "--watch",
            str(tmp_path / "w"),
            "--destination",
            f"file://{tmp_path}/r",
            env={"CKPT_SIDECAR_ADMIN__PORT": str(port)},
        )
    assert r.returncode == 2 and "admin.port" in r.stderr
