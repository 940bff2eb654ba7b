"""Configuration: YAML file < environment (``CKPT_SIDECAR_<SECTION>__<KEY>``) < flags.

:func:`load` returns a validated, frozen :class:`Config` or raises :class:`ConfigError`,
whose message names every bad key, the value given and what is allowed. The CLI turns a
:class:`ConfigError` into exit status 2 before anything starts.
"""

from __future__ import annotations

import json
import re
import signal
import types
import typing
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
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)


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
    part_size_bytes: int | None = Field(default=None, ge=5 * MiB, le=5 * GiB)
    """When set: the part size of the destination's backend unless its own key is set
    (``destination.s3.part_size_bytes``, ``gcs.xml_part_size_bytes``,
    ``azure.block_size_bytes``); each of those defaults to 8 MiB."""
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

    @field_validator("notify_signal")
    @classmethod
    def _signal_name(cls, v: str | None) -> str | None:
        """A name ``signal.Signals`` knows, stored as it spells it (``usr1`` -> ``SIGUSR1``),
        so the drain's ``signal.Signals[name.upper()]`` cannot fail on it."""
        if v is None:
            return None
        name = v.strip().upper()
        if not name.startswith("SIG"):
            name = "SIG" + name
        if name not in signal.Signals.__members__:
            raise ValueError(
                "not a signal name on this system; give one such as SIGUSR1, SIGUSR2, SIGTERM "
                "or SIGINT (the SIG prefix and the case are optional)"
            )
        return name

    @model_validator(mode="after")
    def _notify_pair(self) -> PreemptionConfig:
        if (self.notify_signal is None) != (self.notify_pid_file is None):
            given, missing = (
                ("notify_signal", "notify_pid_file")
                if self.notify_pid_file is None
                else ("notify_pid_file", "notify_signal")
            )
            raise ValueError(
                f"preemption.{given} is set but preemption.{missing} is not, so the trainer "
                "would never be signalled: set preemption.notify_signal (e.g. SIGUSR1) and "
                "preemption.notify_pid_file (the file holding the trainer's PID) together, "
                "or neither"
            )
        return self


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


#: destination scheme -> (its section, its part-size key), for ``upload.part_size_bytes``
_PART_SIZE_KEYS = {
    "s3": ("s3", "part_size_bytes"),
    "gs": ("gcs", "xml_part_size_bytes"),
    "az": ("azure", "block_size_bytes"),
    "https": ("azure", "block_size_bytes"),
}


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

    @model_validator(mode="before")
    @classmethod
    def _shared_part_size(cls, data: Any) -> Any:
        """``upload.part_size_bytes`` becomes the destination backend's own part-size key
        when that is not set, and is checked against that backend's limits there."""
        if not isinstance(data, dict):
            return data
        upload, dest = data.get("upload"), data.get("destination")
        size = upload.get("part_size_bytes") if isinstance(upload, dict) else None
        if size is None or not isinstance(dest, dict):
            return data
        url = dest.get("url", DestinationConfig.model_fields["url"].default)
        try:
            scheme = parse_destination(str(url)).scheme
        except DestinationUrlError:
            return data  # the url's own check reports it
        key = _PART_SIZE_KEYS.get(scheme)
        section = dest.get(key[0], {}) if key else None
        if key is None or not isinstance(section, dict) or key[1] in section:
            return data
        model = DestinationConfig.model_fields[key[0]].annotation
        assert isinstance(model, type) and issubclass(model, BaseModel)
        try:
            model.model_validate({key[1]: size})
        except ValidationError as e:
            why = str(e.errors()[0]["msg"])
            raise ValueError(
                f"upload.part_size_bytes = {size!r} is destination.{key[0]}.{key[1]} for this "
                f"destination: {why}; change it, or set destination.{key[0]}.{key[1]}"
            ) from None
        return {**data, "destination": {**dest, key[0]: {**section, key[1]: size}}}

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
            return raw  # not JSON: a plain string, e.g. a regular expression "[._-](\d+)"
    return raw


def _is_list(annotation: Any) -> bool:
    origin = typing.get_origin(annotation)
    if origin in (typing.Union, types.UnionType):
        return any(_is_list(a) for a in typing.get_args(annotation))
    return origin in (list, tuple, set, frozenset)


def _list_keys(model: type[BaseModel], prefix: tuple[str, ...] = ()) -> set[tuple[str, ...]]:
    """Every list- or tuple-typed key, found by type, so a new list key splits like the rest."""
    out: set[tuple[str, ...]] = set()
    for name, field in model.model_fields.items():
        ann = field.annotation
        if isinstance(ann, type) and issubclass(ann, BaseModel):
            out |= _list_keys(ann, (*prefix, name))
        elif _is_list(ann):
            out.add((*prefix, name))
    return out


def _env_list(name: str, key: str, raw: str) -> Any:
    """A JSON list (``["a", "b"]``) or comma-separated values (``a, b``; also globs such as
    ``[0-9]*,step_*``: text starting with ``[`` is taken for JSON only when it holds a quote
    or ends with ``]``)."""
    text = raw.strip()
    quoted = '"' in text or "'" in text or text.endswith(("]", "}"))
    if text.startswith(("[", "{")) and quoted:  # '[0-9]*,x' is globs, not broken JSON
        try:
            return json.loads(text)
        except json.JSONDecodeError as e:
            raise ConfigError(
                f"environment variable {name} ({key}): starts with {text[0]!r} but is not valid "
                f"JSON ({e.msg}, character {e.pos + 1}); give a JSON list such as "
                """'["a", "b"]' or comma-separated values such as a,b"""
            ) from None
    return [v.strip() for v in text.split(",") if v.strip()]


def _from_env(env: Mapping[str, str]) -> dict[str, Any]:
    list_keys = _list_keys(Config)
    tree: dict[str, Any] = {}
    for name, raw in sorted(env.items()):
        if not name.startswith(ENV_PREFIX):
            continue
        path = [p.lower() for p in name[len(ENV_PREFIX) :].split("__")]
        if not all(path):
            raise ConfigError(f"environment variable {name}: empty section or key name")
        if tuple(path) in list_keys:
            value = _env_list(name, ".".join(path), raw)
        else:
            value = _env_value(raw)
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
    except UnicodeDecodeError as e:
        raise ConfigError(
            f"config file {path} is not UTF-8 text (byte {e.start + 1}: {e.reason}); "
            "save it as UTF-8"
        ) from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as e:
        raise ConfigError(f"config file {path} is not valid YAML: {_yaml_problem(e)}") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(f"config file {path}: the top level must be a mapping of sections")
    return data


# Quoted parts of PyYAML's messages that cannot hold a value: one character ('\t', ':') or a
# token name ('<block mapping start>'). Anything else quoted (an alias, a tag) may be a secret.
_YAML_SAFE_QUOTE = re.compile(r"'(?:[^'\\]|\\[a-z\\]|<[a-z ]+>)'|\"'\"")


def _yaml_words(text: str | None) -> str | None:
    if not text:
        return None
    if re.search("['\"]", _YAML_SAFE_QUOTE.sub("", text)):
        return "syntax error (details not shown: they would quote the file's text)"
    return text


def _yaml_problem(e: yaml.YAMLError) -> str:
    """Where and what, never the text there: PyYAML's own message quotes the offending line,
    and on a ``sas_token:`` or ``token:`` line that is a secret."""
    if not isinstance(e, yaml.MarkedYAMLError):
        position = getattr(e, "position", None)
        at = f" at character {position + 1}" if isinstance(position, int) else ""
        return f"{type(e).__name__}{at}; fix the file there"
    parts = []
    problem = _yaml_words(e.problem) or "syntax error"
    if e.problem_mark is not None:
        mark = e.problem_mark
        parts.append(f"line {mark.line + 1}, column {mark.column + 1}: {problem}")
    else:
        parts.append(problem)
    context = _yaml_words(e.context)
    if context and e.context_mark is not None:
        mark = e.context_mark
        parts.append(f"({context} started at line {mark.line + 1}, column {mark.column + 1})")
    elif context:
        parts.append(f"({context})")
    return (
        " ".join(parts) + "; fix the syntax there (an unclosed quote or bracket, or a tab in "
        "the indentation, is the usual cause). The line itself is not shown: it may hold a secret"
    )


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
