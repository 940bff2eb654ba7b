"""The configuration's schema: every section and key, its default, type and range, and the
checks across keys. A :class:`Config` is frozen and valid by construction; reading one from
YAML, the environment and flags is :mod:`sidecar.config_load`.
"""

from __future__ import annotations

import re
import signal
from pathlib import Path
from typing import Any, Literal

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

__all__ = ["ENV_PREFIX", "Config"]

ENV_PREFIX = "CKPT_SIDECAR_"
GiB = 1024**3
MiB = 1024**2
LAYOUTS = ("plain", "torch-dcp", "orbax", "deepspeed", "hf-trainer", "marker")


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
