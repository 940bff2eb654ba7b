"""Configuration: YAML file < environment (``CKPT_SIDECAR_<SECTION>__<KEY>``) < flags.

:func:`load` returns a validated, frozen :class:`Config` or raises :class:`ConfigError`,
whose message names every bad key, the value given and what is allowed. The CLI turns a
:class:`ConfigError` into exit status 2 before anything starts.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    SecretStr,
    ValidationError,
    field_validator,
    model_validator,
)

from sidecar.preemption.options import (
    AwsMetadataOptions,
    AzureMetadataOptions,
    GcpMetadataOptions,
)
from sidecar.storage.options import AzureOptions, GcsOptions, S3Options
from sidecar.storage.url import DestinationUrlError, parse_destination

__all__ = ["ENV_PREFIX", "Config", "ConfigError", "load", "redacted"]

ENV_PREFIX = "CKPT_SIDECAR_"
GiB = 1024**3
MiB = 1024**2
LAYOUTS = ("plain", "torch-dcp", "orbax", "deepspeed", "hf-trainer", "marker")


class ConfigError(Exception):
    """Invalid configuration; the message is meant for the operator as is."""


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class WatchConfig(_Section):
    path: Path = Path("./checkpoints")
    mode: Literal["auto", "inotify", "poll"] = "auto"
    settle_seconds: float = Field(default=1.0, ge=0, le=3600)
    poll_interval_seconds: float = Field(default=1.0, gt=0, le=3600)


class CheckpointConfig(_Section):
    layout: Literal["plain", "torch-dcp", "orbax", "deepspeed", "hf-trainer", "marker"] = "plain"
    pattern: list[str] | None = None
    step_regex: str | None = None
    marker: str | None = None

    @field_validator("step_regex")
    @classmethod
    def _regex(cls, v: str | None) -> str | None:
        if v is not None:
            try:
                rx = re.compile(v)
            except re.error as e:
                raise ValueError(f"not a valid regular expression: {e}") from e
            if rx.groups < 1:
                raise ValueError("needs one capture group for the step number")
        return v

    @model_validator(mode="after")
    def _check(self) -> CheckpointConfig:
        if self.layout == "marker" and not self.marker:
            raise ValueError("layout 'marker' needs checkpoint.marker (the file name to wait for)")
        return self


class OtherFilesConfig(_Section):
    enabled: bool = True
    interval_seconds: float = Field(default=60.0, gt=0)


class DestinationConfig(_Section):
    url: str = "file://./.ckpt-remote"
    allowed_regions: list[str] = Field(default_factory=list)
    s3: S3Options = Field(default_factory=S3Options)
    gcs: GcsOptions = Field(default_factory=GcsOptions)
    azure: AzureOptions = Field(default_factory=AzureOptions)

    @field_validator("url")
    @classmethod
    def _check_url(cls, v: str) -> str:
        try:
            parse_destination(v)
        except DestinationUrlError as e:
            raise ValueError(str(e)) from e
        return v


class UploadConfig(_Section):
    concurrency: int = Field(default=4, ge=1, le=128)
    part_size_bytes: int = Field(default=64 * MiB, ge=5 * MiB, le=5 * GiB)
    max_bandwidth_bytes_per_second: int = Field(default=0, ge=0)
    stale_multipart_hours: float = Field(default=24.0, gt=0)
    max_attempts: int = Field(default=8, ge=1, le=1000)
    backoff_initial_seconds: float = Field(default=0.5, gt=0)
    backoff_max_seconds: float = Field(default=30.0, gt=0)


class QueueConfig(_Section):
    max_checkpoints: int = Field(default=4, ge=1)
    max_bytes: int = Field(default=512 * GiB, ge=1)


class RetentionConfig(_Section):
    keep_last: int = Field(default=3, ge=2)
    keep_every_steps: int = Field(default=0, ge=0)
    orphan_sweep_hours: float = Field(default=24.0, ge=0)


class PreemptionConfig(_Section):
    source: Literal["auto", "aws", "gcp", "azure", "none"] = "auto"
    notify_signal: str | None = None
    notify_pid_file: Path | None = None
    trigger_file: Path | None = None
    aws: AwsMetadataOptions = Field(default_factory=AwsMetadataOptions)
    gcp: GcpMetadataOptions = Field(default_factory=GcpMetadataOptions)
    azure: AzureMetadataOptions = Field(default_factory=AzureMetadataOptions)


class AdminConfig(_Section):
    enabled: bool = True
    host: str = "127.0.0.1"
    port: int = Field(default=9477, ge=0, le=65535)
    token: SecretStr | None = None


class StateConfig(_Section):
    dir: Path | None = None


class LogConfig(_Section):
    level: Literal["debug", "info", "warning", "error"] = "info"
    format: Literal["auto", "json", "console"] = "auto"


class Config(_Section):
    """The whole configuration; every key is documented in ``config.example.yaml``."""

    watch: WatchConfig = Field(default_factory=WatchConfig)
    checkpoint: CheckpointConfig = Field(default_factory=CheckpointConfig)
    other_files: OtherFilesConfig = Field(default_factory=OtherFilesConfig)
    destination: DestinationConfig = Field(default_factory=DestinationConfig)
    upload: UploadConfig = Field(default_factory=UploadConfig)
    queue: QueueConfig = Field(default_factory=QueueConfig)
    retention: RetentionConfig = Field(default_factory=RetentionConfig)
    preemption: PreemptionConfig = Field(default_factory=PreemptionConfig)
    admin: AdminConfig = Field(default_factory=AdminConfig)
    state: StateConfig = Field(default_factory=StateConfig)
    log: LogConfig = Field(default_factory=LogConfig)
    shutdown_grace_seconds: float = Field(default=30.0, gt=0, le=3600)

    @property
    def state_dir(self) -> Path:
        return self.state.dir or self.watch.path / ".ckpt-sidecar-state"


def _set_path(tree: dict[str, Any], path: list[str], value: Any, origin: str) -> None:
    node = tree
    for part in path[:-1]:
        child = node.setdefault(part, {})
        if not isinstance(child, dict):
            raise ConfigError(f"{origin}: {'.'.join(path)}: '{part}' is not a section")
        node = child
    node[path[-1]] = value


def _env_value(raw: str) -> Any:
    text = raw.strip()
    if text.startswith(("[", "{")):
        try:
            return json.loads(text)
        except json.JSONDecodeError:
            return raw
    return raw


_LIST_KEYS = {("checkpoint", "pattern"), ("destination", "allowed_regions")}


def _from_env(env: Mapping[str, str]) -> dict[str, Any]:
    tree: dict[str, Any] = {}
    for name, raw in sorted(env.items()):
        if not name.startswith(ENV_PREFIX):
            continue
        path = [p.lower() for p in name[len(ENV_PREFIX) :].split("__")]
        if not all(path):
            raise ConfigError(f"environment variable {name}: empty section or key name")
        value = _env_value(raw)
        if tuple(path) in _LIST_KEYS and isinstance(value, str):
            value = [v.strip() for v in value.split(",") if v.strip()]
        _set_path(tree, path, value, f"environment variable {name}")
    return tree


def _merge(base: dict[str, Any], over: Mapping[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for k, v in over.items():
        if isinstance(v, Mapping) and isinstance(out.get(k), dict):
            out[k] = _merge(out[k], v)
        else:
            out[k] = v
    return out


def _read_yaml(path: Path) -> dict[str, Any]:
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ConfigError(f"config file {path} does not exist; pass an existing --config") from None
    except OSError as e:
        raise ConfigError(f"config file {path} cannot be read: {e.strerror}") from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as e:
        raise ConfigError(f"config file {path} is not valid YAML: {e}") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(f"config file {path}: the top level must be a mapping of sections")
    return data


def _secret_keys(model: type[BaseModel], prefix: str = "") -> set[str]:
    """Dotted names of every ``SecretStr`` field, found by type, not by name."""
    out: set[str] = set()
    for name, field in model.model_fields.items():
        ann = field.annotation
        if ann is not None and "SecretStr" in str(ann):
            out.add(prefix + name)
        elif isinstance(ann, type) and issubclass(ann, BaseModel):
            out |= _secret_keys(ann, f"{prefix}{name}.")
    return out


def _without_userinfo(value: Any) -> Any:
    """``s3://key:secret@bucket`` -> ``s3://***@bucket``: credentials never reach a message."""
    if isinstance(value, str) and "://" in value:
        scheme, rest = value.split("://", 1)
        host, sep, path = rest.partition("/")
        if "@" in host:
            return f"{scheme}://***@{host.rsplit('@', 1)[1]}{sep}{path}"
    return value


def _describe(err: ValidationError) -> str:
    secrets = _secret_keys(Config)
    lines = []
    for e in err.errors():
        key = ".".join(str(p) for p in e["loc"]) or "(top level)"
        if e["type"] == "extra_forbidden":
            lines.append(f"{key}: unknown key; see config.example.yaml for the keys that exist")
            continue
        value = e.get("input")
        msg = str(e["msg"]).removeprefix("Value error, ")
        if isinstance(value, dict):  # a check of a whole section: its message names the keys
            lines.append(f"{key}: {msg}")
            continue
        hidden = any(
            key == s or key.startswith(s + ".") or s.startswith(key + ".") for s in secrets
        )
        shown = "***" if hidden else repr(_without_userinfo(value))
        lines.append(f"{key} = {shown}: {msg}")
    return "invalid configuration:\n  " + "\n  ".join(lines)


def load(
    path: Path | None = None,
    env: Mapping[str, str] | None = None,
    overrides: Mapping[str, Any] | None = None,
) -> Config:
    """Build the effective config. ``overrides`` maps dotted keys (``watch.path``) to values."""
    tree = _read_yaml(path) if path is not None else {}
    tree = _merge(tree, _from_env(env or {}))
    flag_tree: dict[str, Any] = {}
    for dotted, value in (overrides or {}).items():
        if value is not None:
            _set_path(flag_tree, dotted.split("."), value, f"flag for {dotted}")
    tree = _merge(tree, flag_tree)
    try:
        return Config.model_validate(tree)
    except ValidationError as e:
        raise ConfigError(_describe(e)) from None


def redacted(cfg: Config) -> dict[str, Any]:
    """The config as plain data with every secret replaced by ``***``."""

    def walk(v: Any) -> Any:
        if isinstance(v, SecretStr):
            return "***"
        if isinstance(v, BaseModel):
            return {k: walk(getattr(v, k)) for k in type(v).model_fields}
        if isinstance(v, Path):
            return str(v)
        if isinstance(v, list):
            return [walk(x) for x in v]
        return v

    out: dict[str, Any] = walk(cfg)
    return out
