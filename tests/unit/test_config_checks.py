"""Config checks found by review: YAML errors keep secrets out, signal names, Azure event
types and environment lists are checked when the config is loaded, not during a drain."""

from __future__ import annotations

import signal
from pathlib import Path

import pytest

from sidecar import cli
from sidecar.config_load import ConfigError, load

SECRET = "sig=T0pS3cretXyz"
EXAMPLE = Path(__file__).resolve().parents[2] / "config.example.yaml"


def yaml_file(tmp_path: Path, text: str) -> Path:
    p = tmp_path / "config.yaml"
    p.write_text(text)
    return p


# -- 1. a YAML syntax error names the place, never the text there ----------------------------
BROKEN = [
    # an unterminated quote: PyYAML's message quotes this line, secret and all
    ('destination:\n  azure:\n    sas_token: "sv=2021&' + SECRET + "\n    region: x\n", 3),
    ("destination:\n  azure:\n    account_key: '" + SECRET + "\nadmin:\n  port: 1\n", 3),
    ("admin:\n  token: [" + SECRET + "\nlog:\n  level: info\n", 2),
    ("admin:\n  token: *" + SECRET.replace("=", "") + "\n", 2),  # an alias is quoted too
    ("admin:\n  token: " + SECRET + ": x\n", 2),
]


@pytest.mark.parametrize(("text", "line"), BROKEN)
def test_yaml_syntax_error_names_the_line_but_not_the_secret(
    tmp_path: Path, text: str, line: int
) -> None:
    with pytest.raises(ConfigError) as e:
        load(yaml_file(tmp_path, text))
    msg = str(e.value)
    assert "is not valid YAML" in msg and f"line {line}," in msg, msg
    assert "T0pS3cret" not in msg, msg
    assert "sv=2021" not in msg, msg


def test_yaml_syntax_error_keeps_the_useful_part_of_the_problem(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as e:
        load(yaml_file(tmp_path, "watch:\n\tpath: /x\n"))
    assert "line 2, column 1: found character '\\t' that cannot start any token" in str(e.value)


def test_config_check_prints_no_secret_of_a_broken_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    cfg = yaml_file(tmp_path, BROKEN[0][0])
    assert cli.main(["config", "--check", "--config", str(cfg)]) == 2
    out = capsys.readouterr()
    assert "T0pS3cret" not in out.out + out.err
    assert "line 3," in out.err and "is not valid YAML" in out.err


def test_a_file_that_is_not_utf8_is_a_config_error(tmp_path: Path) -> None:
    p = tmp_path / "config.yaml"
    p.write_bytes(b"admin:\n  token: \xff\xfe\n")
    with pytest.raises(ConfigError, match="not UTF-8"):
        load(p)


# -- 2. preemption.notify_signal -------------------------------------------------------------
PID_FILE = {"CKPT_SIDECAR_PREEMPTION__NOTIFY_PID_FILE": "/run/trainer.pid"}


@pytest.mark.parametrize(
    ("given", "stored"),
    [("SIGUSR1", "SIGUSR1"), ("sigusr2", "SIGUSR2"), ("USR1", "SIGUSR1"), (" term ", "SIGTERM")],
)
def test_notify_signal_is_stored_as_a_name_the_drain_can_look_up(given: str, stored: str) -> None:
    cfg = load(env={"CKPT_SIDECAR_PREEMPTION__NOTIFY_SIGNAL": given, **PID_FILE})
    assert cfg.preemption.notify_signal == stored
    assert signal.Signals[cfg.preemption.notify_signal.upper()].name == stored  # as drain.py


@pytest.mark.parametrize("given", ["SIGFOO", "FOO", "10", ""])
def test_unknown_notify_signal_is_a_config_error(given: str) -> None:
    with pytest.raises(ConfigError) as e:
        load(env={"CKPT_SIDECAR_PREEMPTION__NOTIFY_SIGNAL": given, **PID_FILE})
    msg = str(e.value)
    assert f"preemption.notify_signal = {given!r}" in msg and "SIGUSR1" in msg, msg


def test_notify_signal_without_pid_file_is_a_config_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as e:
        load(yaml_file(tmp_path, "preemption:\n  notify_signal: SIGUSR1\n"))
    msg = str(e.value)
    assert "preemption.notify_signal" in msg and "preemption.notify_pid_file" in msg, msg


def test_notify_pid_file_without_signal_is_a_config_error() -> None:
    with pytest.raises(ConfigError) as e:
        load(env=PID_FILE)
    assert "preemption.notify_pid_file is set but preemption.notify_signal" in str(e.value)


def test_config_check_exits_2_on_a_signal_without_pid_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    cfg = yaml_file(tmp_path, "preemption:\n  notify_signal: USR1\n")
    assert cli.main(["config", "--check", "--config", str(cfg)]) == 2
    assert "preemption.notify_pid_file" in capsys.readouterr().err


# -- 3. preemption.azure.event_types -----------------------------------------------------------
def test_misspelt_azure_event_type_is_a_config_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as e:
        load(yaml_file(tmp_path, "preemption:\n  azure:\n    event_types: [Preemt, Terminate]\n"))
    msg = str(e.value)
    assert "preemption.azure.event_types" in msg and "'Preemt'" in msg, msg
    assert "Freeze, Reboot, Redeploy, Preempt, Terminate" in msg, msg


def test_empty_azure_event_types_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match=r"preemption\.azure\.event_types"):
        load(env={"CKPT_SIDECAR_PREEMPTION__AZURE__EVENT_TYPES": "[]"})


def test_azure_event_types_are_stored_as_azure_spells_them() -> None:
    cfg = load(overrides={"preemption.azure.event_types": ["preempt", "Reboot", "PREEMPT"]})
    assert cfg.preemption.azure.event_types == ("Preempt", "Reboot")
    assert load().preemption.azure.event_types == ("Preempt", "Terminate")


# -- 4. environment lists -----------------------------------------------------------------------
@pytest.mark.parametrize(
    "raw", ["Preempt,Terminate", " Preempt , Terminate ", '["Preempt", "Terminate"]']
)
def test_tuple_key_from_environment_takes_commas_and_json(raw: str) -> None:
    cfg = load(env={"CKPT_SIDECAR_PREEMPTION__AZURE__EVENT_TYPES": raw})
    assert cfg.preemption.azure.event_types == ("Preempt", "Terminate")


@pytest.mark.parametrize(
    "var",
    [
        "CKPT_SIDECAR_CHECKPOINT__PATTERN",
        "CKPT_SIDECAR_DESTINATION__ALLOWED_REGIONS",
        "CKPT_SIDECAR_PREEMPTION__AZURE__EVENT_TYPES",
    ],
)
def test_malformed_json_list_in_environment_is_a_config_error(var: str) -> None:
    with pytest.raises(ConfigError) as e:
        load(env={var: '["Preempt", "bad'})
    msg = str(e.value)
    assert var in msg and "not valid JSON" in msg and "comma-separated" in msg, msg


def test_malformed_json_pattern_is_not_taken_as_globs() -> None:
    with pytest.raises(ConfigError, match="CKPT_SIDECAR_CHECKPOINT__PATTERN"):
        load(env={"CKPT_SIDECAR_CHECKPOINT__PATTERN": '["*.pt", "bad'})


def test_a_regex_starting_with_a_bracket_is_still_a_plain_string() -> None:
    cfg = load(env={"CKPT_SIDECAR_CHECKPOINT__STEP_REGEX": r"[._-](\d+)$"})
    assert cfg.checkpoint.step_regex == r"[._-](\d+)$"


def test_the_example_config_still_loads() -> None:
    cfg = load(EXAMPLE)
    assert cfg.preemption.notify_signal is None
    assert cfg.preemption.azure.event_types == ("Preempt", "Terminate")


@pytest.mark.parametrize(
    "env",
    [
        {"CKPT_SIDECAR_PREEMPTION__AWS__DEFAULT_DEADLINE_SECONDS": "inf"},
        {"CKPT_SIDECAR_PREEMPTION__AWS__DEFAULT_DEADLINE_SECONDS": "1e12"},
        {"CKPT_SIDECAR_PREEMPTION__GCP__PREEMPT_DEADLINE_SECONDS": "nan"},
        {"CKPT_SIDECAR_WATCH__SETTLE_SECONDS": "inf"},
    ],
)
def test_a_deadline_or_interval_that_is_not_a_finite_sane_number_is_a_config_error(
    env: dict[str, str],
) -> None:
    with pytest.raises(ConfigError):
        load(None, env=env)


MiB = 1024 * 1024


@pytest.mark.parametrize(
    ("url", "section", "key"),
    [
        ("s3://bucket/run", "s3", "part_size_bytes"),
        ("gs://bucket/run", "gcs", "xml_part_size_bytes"),
        ("az://ckpt/run", "azure", "block_size_bytes"),
    ],
)
def test_upload_part_size_is_the_backends_part_size_unless_its_own_key_is_set(
    url: str, section: str, key: str
) -> None:
    env = {"CKPT_SIDECAR_DESTINATION__URL": url, "CKPT_SIDECAR_UPLOAD__PART_SIZE_BYTES": "16777216"}
    cfg = load(None, env=env)
    assert getattr(getattr(cfg.destination, section), key) == 16 * MiB
    own = {f"CKPT_SIDECAR_DESTINATION__{section.upper()}__{key.upper()}": str(32 * MiB)}
    cfg = load(None, env={**env, **own})
    assert getattr(getattr(cfg.destination, section), key) == 32 * MiB
    assert (
        getattr(
            getattr(load(None, env={"CKPT_SIDECAR_DESTINATION__URL": url}).destination, section),
            key,
        )
        == 8 * MiB
    )


def test_upload_part_size_beyond_the_backends_limit_names_the_backends_key() -> None:
    env = {
        "CKPT_SIDECAR_DESTINATION__URL": "az://ckpt/run",
        "CKPT_SIDECAR_UPLOAD__PART_SIZE_BYTES": str(4500 * MiB),
    }
    with pytest.raises(ConfigError) as e:
        load(None, env=env)
    assert "upload.part_size_bytes = " in str(e.value)
    assert "destination.azure.block_size_bytes" in str(e.value)


def test_a_glob_starting_with_a_bracket_is_a_pattern_not_broken_json() -> None:
    cfg = load(None, env={"CKPT_SIDECAR_CHECKPOINT__PATTERN": "[0-9]*,step_*"})
    assert cfg.checkpoint.pattern == ["[0-9]*", "step_*"]


def test_a_single_quoted_list_is_an_error_not_patterns_that_never_match() -> None:
    with pytest.raises(ConfigError, match="CKPT_SIDECAR_CHECKPOINT__PATTERN"):
        load(None, env={"CKPT_SIDECAR_CHECKPOINT__PATTERN": "['*.pt','*.bin']"})
