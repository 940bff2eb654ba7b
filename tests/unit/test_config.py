"""Config: YAML file < environment < flags; errors name the key, the value and what is allowed."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from sidecar.config_load import ConfigError, load, redacted


def yaml_file(tmp_path: Path, text: str) -> Path:
    p = tmp_path / "config.yaml"
    p.write_text(text)
    return p


def test_defaults_are_the_documented_ones() -> None:
    cfg = load()
    assert cfg.watch.path == Path("./checkpoints")
    assert cfg.watch.mode == "auto"
    assert cfg.destination.url == "file://./.ckpt-remote"
    assert cfg.admin.host == "127.0.0.1" and cfg.admin.port == 9477
    assert cfg.retention.keep_last >= 2
    assert cfg.upload.stale_multipart_hours == 24
    assert cfg.state_dir == Path("./checkpoints/.ckpt-sidecar-state")


def test_file_then_environment_then_flags(tmp_path: Path) -> None:
    cfg_file = yaml_file(
        tmp_path,
        "watch:\n  path: /from/file\n  settle_seconds: 2.5\n"
        "upload:\n  concurrency: 2\n"
        "destination:\n  url: file:///from/file\n",
    )
    env = {
        "CKPT_SIDECAR_WATCH__PATH": "/from/env",
        "CKPT_SIDECAR_UPLOAD__CONCURRENCY": "9",
        "UNRELATED": "x",
    }
    cfg = load(cfg_file, env, {"watch.path": "/from/flag", "destination.url": None})
    assert cfg.watch.path == Path("/from/flag"), "a flag beats the environment"
    assert cfg.upload.concurrency == 9, "the environment beats the file"
    assert cfg.watch.settle_seconds == 2.5, "the file beats the default"
    assert cfg.destination.url == "file:///from/file", "an unset flag changes nothing"


def test_environment_list_and_top_level_keys() -> None:
    cfg = load(
        env={
            "CKPT_SIDECAR_CHECKPOINT__PATTERN": "run-*, *.pt",
            "CKPT_SIDECAR_DESTINATION__ALLOWED_REGIONS": '["us-east-1", "eu-west-1"]',
            "CKPT_SIDECAR_SHUTDOWN_GRACE_SECONDS": "12",
            "CKPT_SIDECAR_OTHER_FILES__ENABLED": "false",
        }
    )
    assert cfg.checkpoint.pattern == ["run-*", "*.pt"]
    assert cfg.destination.allowed_regions == ["us-east-1", "eu-west-1"]
    assert cfg.shutdown_grace_seconds == 12
    assert cfg.other_files.enabled is False


def test_nested_backend_options_from_environment() -> None:
    cfg = load(
        env={
            "CKPT_SIDECAR_DESTINATION__URL": "s3://bucket/prefix",
            "CKPT_SIDECAR_DESTINATION__S3__REGION": "eu-west-1",
            "CKPT_SIDECAR_DESTINATION__S3__PART_CONCURRENCY": "3",
        }
    )
    assert cfg.destination.s3.region == "eu-west-1"
    assert cfg.destination.s3.part_concurrency == 3


def test_kubernetes_service_links_are_not_taken_for_keys() -> None:
    """Kubernetes gives every container variables for each Service in its namespace; a
    Service named ckpt-sidecar (or ckpt-sidecar-metrics) must not stop the daemon with
    exit 2, while a misspelt key still does."""
    links = {
        "CKPT_SIDECAR_SERVICE_HOST": "10.0.0.7",
        "CKPT_SIDECAR_SERVICE_PORT": "9477",
        "CKPT_SIDECAR_SERVICE_PORT_METRICS": "9477",
        "CKPT_SIDECAR_PORT": "tcp://10.0.0.7:9477",
        "CKPT_SIDECAR_PORT_9477_TCP": "tcp://10.0.0.7:9477",
        "CKPT_SIDECAR_PORT_9477_TCP_PROTO": "tcp",
        "CKPT_SIDECAR_PORT_9477_TCP_PORT": "9477",
        "CKPT_SIDECAR_PORT_9477_TCP_ADDR": "10.0.0.7",
        "CKPT_SIDECAR_METRICS_SERVICE_HOST": "10.0.0.8",
        "CKPT_SIDECAR_METRICS_PORT_9477_UDP_ADDR": "10.0.0.8",
    }
    cfg = load(env={**links, "CKPT_SIDECAR_ADMIN__PORT": "9478"})
    assert cfg.admin.port == 9478
    with pytest.raises(ConfigError, match="shutdown_grace"):
        load(env={**links, "CKPT_SIDECAR_SHUTDOWN_GRACE": "5"})
    with pytest.raises(ConfigError, match="admin_port"):  # one _ too few: not a link's value
        load(env={**links, "CKPT_SIDECAR_ADMIN_PORT": "9478"})


BAD = [
    ("CKPT_SIDECAR_WATCH__MODE", "fanotify", "watch.mode"),
    ("CKPT_SIDECAR_WATCH__SETTLE_SECONDS", "-1", "watch.settle_seconds"),
    ("CKPT_SIDECAR_WATCH__POLL_INTERVAL_SECONDS", "0", "watch.poll_interval_seconds"),
    ("CKPT_SIDECAR_WATCH__PATHH", "/x", "watch.pathh"),
    ("CKPT_SIDECAR_WACTH__PATH", "/x", "wacth"),
    ("CKPT_SIDECAR_CHECKPOINT__LAYOUT", "nemo", "checkpoint.layout"),
    ("CKPT_SIDECAR_CHECKPOINT__STEP_REGEX", "step(", "step_regex"),
    ("CKPT_SIDECAR_CHECKPOINT__STEP_REGEX", r"step\d+", "step_regex"),
    ("CKPT_SIDECAR_CHECKPOINT__LAYOUT", "marker", "checkpoint.marker"),
    ("CKPT_SIDECAR_DESTINATION__URL", "ftp://host/x", "destination.url"),
    ("CKPT_SIDECAR_UPLOAD__CONCURRENCY", "0", "upload.concurrency"),
    ("CKPT_SIDECAR_UPLOAD__CONCURRENCY", "four", "upload.concurrency"),
    ("CKPT_SIDECAR_UPLOAD__PART_SIZE_BYTES", "1024", "upload.part_size_bytes"),
    ("CKPT_SIDECAR_UPLOAD__MAX_BANDWIDTH_BYTES_PER_SECOND", "-5", "max_bandwidth"),
    ("CKPT_SIDECAR_QUEUE__MAX_CHECKPOINTS", "0", "queue.max_checkpoints"),
    ("CKPT_SIDECAR_QUEUE__MAX_BYTES", "-1", "queue.max_bytes"),
    ("CKPT_SIDECAR_RETENTION__KEEP_LAST", "1", "retention.keep_last"),
    ("CKPT_SIDECAR_PREEMPTION__SOURCE", "oracle", "preemption.source"),
    ("CKPT_SIDECAR_ADMIN__PORT", "70000", "admin.port"),
    ("CKPT_SIDECAR_LOG__LEVEL", "verbose", "log.level"),
    ("CKPT_SIDECAR_SHUTDOWN_GRACE_SECONDS", "soon", "shutdown_grace_seconds"),
    ("CKPT_SIDECAR_DESTINATION__S3__PART_CONCURRENCY", "0", "destination.s3.part_concurrency"),
]


@pytest.mark.parametrize(("var", "value", "key"), BAD, ids=[f"{b[0]}={b[1]}" for b in BAD])
def test_bad_value_is_a_config_error_naming_the_key(var: str, value: str, key: str) -> None:
    with pytest.raises(ConfigError) as e:
        load(env={var: value})
    msg = str(e.value)
    assert key in msg, msg
    assert msg.startswith("invalid configuration")


@pytest.mark.parametrize(
    ("key", "value", "allowed"),
    [
        ("watch.mode", "fanotify", "'auto', 'inotify' or 'poll'"),
        ("retention.keep_last", 1, "greater than or equal to 2"),
        ("upload.concurrency", 500, "less than or equal to 128"),
    ],
)
def test_error_shows_the_value_and_what_is_allowed(key: str, value: object, allowed: str) -> None:
    with pytest.raises(ConfigError) as e:
        load(overrides={key: value})
    assert key in str(e.value) and repr(value) in str(e.value) and allowed in str(e.value)


def test_every_bad_key_is_reported_at_once() -> None:
    with pytest.raises(ConfigError) as e:
        load(env={"CKPT_SIDECAR_ADMIN__PORT": "-1", "CKPT_SIDECAR_LOG__LEVEL": "loud"})
    assert "admin.port" in str(e.value) and "log.level" in str(e.value)


def test_a_check_of_a_whole_section_names_the_section_not_a_masked_value(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as e:
        load(yaml_file(tmp_path, "checkpoint:\n  layout: marker\n"))
    assert "\n  checkpoint: layout 'marker' needs checkpoint.marker" in str(e.value)
    assert "***" not in str(e.value)  # nothing secret was there to hide


def test_bad_value_in_the_file_names_the_key(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"queue\.max_checkpoints"):
        load(yaml_file(tmp_path, "queue:\n  max_checkpoints: -3\n"))


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("watch: [unclosed\n", "is not valid YAML"),
        ("- a\n- b\n", "top level must be a mapping"),
        ("watch: 5\n", "watch"),
    ],
)
def test_broken_files_are_config_errors(tmp_path: Path, text: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        load(yaml_file(tmp_path, text))


def test_missing_config_file_is_named(tmp_path: Path) -> None:
    missing = tmp_path / "nope.yaml"
    with pytest.raises(ConfigError, match=r"nope\.yaml does not exist"):
        load(missing)


def test_empty_config_file_means_defaults(tmp_path: Path) -> None:
    assert load(yaml_file(tmp_path, "")) == load()


def test_environment_with_empty_key_is_refused() -> None:
    with pytest.raises(ConfigError, match="CKPT_SIDECAR_WATCH__"):
        load(env={"CKPT_SIDECAR_WATCH__": "x"})


def test_environment_value_cannot_replace_a_section_with_a_scalar() -> None:
    with pytest.raises(ConfigError, match="not a section"):
        load(env={"CKPT_SIDECAR_WATCH": "x", "CKPT_SIDECAR_WATCH__PATH": "/p"})


# -- secrets ------------------------------------------------------------------------------
SECRET = "s3cr3t-Value-42"


def test_redacted_hides_every_secret() -> None:
    cfg = load(
        env={
            "CKPT_SIDECAR_ADMIN__TOKEN": SECRET,
            "CKPT_SIDECAR_DESTINATION__AZURE__ACCOUNT_KEY": SECRET + "a",
            "CKPT_SIDECAR_DESTINATION__AZURE__SAS_TOKEN": SECRET + "b",
            "CKPT_SIDECAR_DESTINATION__AZURE__CONNECTION_STRING": SECRET + "c",
        }
    )
    assert cfg.admin.token is not None and cfg.admin.token.get_secret_value() == SECRET
    out = redacted(cfg)
    text = json.dumps(out)
    assert SECRET not in text
    assert out["admin"]["token"] == "***"
    assert out["destination"]["azure"]["account_key"] == "***"
    assert out["watch"]["path"] == "checkpoints"
    assert out["retention"]["keep_last"] == cfg.retention.keep_last


def test_secret_with_wrong_type_is_not_echoed_in_the_error() -> None:
    with pytest.raises(ConfigError) as e:
        load(overrides={"admin.token": {"value": SECRET}})
    assert "admin.token" in str(e.value)
    assert SECRET not in str(e.value)


def test_bad_destination_url_error_does_not_leak_secrets() -> None:
    with pytest.raises(ConfigError) as e:
        load(
            env={
                "CKPT_SIDECAR_DESTINATION__URL": "ftp://x",
                "CKPT_SIDECAR_DESTINATION__AZURE__ACCOUNT_KEY": SECRET,
            }
        )
    assert "destination.url" in str(e.value)
    assert SECRET not in str(e.value)


def test_secret_field_of_wrong_type_is_not_echoed() -> None:
    with pytest.raises(ConfigError) as e:
        load(overrides={"destination.azure.connection_string": [f"AccountKey={SECRET}"]})
    assert "destination.azure.connection_string" in str(e.value)
    assert SECRET not in str(e.value)
