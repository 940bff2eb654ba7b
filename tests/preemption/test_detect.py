"""``auto``: the cloud from DMI files, and the sources that config builds."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from sidecar.config import PreemptionConfig
from sidecar.preemption.aws import AwsSpotSource
from sidecar.preemption.azure import AzureScheduledEventsSource
from sidecar.preemption.detect import detect_cloud
from sidecar.preemption.gcp import GcpMetadataWatch
from sidecar.preemption.sources import build_sources
from sidecar.preemption.trigger import TriggerFileSource

# What real machines report (sys_vendor, product_name, extra files).
MACHINES: dict[str, tuple[dict[str, str], str | None]] = {
    "aws-nitro": ({"sys_vendor": "Amazon EC2", "product_name": "p5.48xlarge"}, "aws"),
    "aws-xen": (
        {"sys_vendor": "Xen", "product_name": "HVM domU", "bios_version": "4.11.amazon"},
        "aws",
    ),
    "gcp": ({"sys_vendor": "Google", "product_name": "Google Compute Engine"}, "gcp"),
    "azure": (
        {
            "sys_vendor": "Microsoft Corporation",
            "product_name": "Virtual Machine",
            "chassis_asset_tag": "7783-7084-3265-9085-8269-3286-77",
        },
        "azure",
    ),
    "bare-metal": ({"sys_vendor": "Supermicro", "product_name": "SYS-421GE-TNRT"}, None),
    "kvm": ({"sys_vendor": "QEMU", "product_name": "Standard PC (Q35 + ICH9, 2009)"}, None),
}


def _dmi(root: Path, files: dict[str, str]) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    for name, text in files.items():
        (root / name).write_text(text + "\n")
    return root


@pytest.mark.parametrize("machine", sorted(MACHINES))
def test_cloud_from_dmi(tmp_path: Path, machine: str) -> None:
    files, expected = MACHINES[machine]
    assert detect_cloud(_dmi(tmp_path / "dmi", files)) == expected


def test_no_dmi_directory_means_no_cloud(tmp_path: Path) -> None:
    assert detect_cloud(tmp_path / "missing") is None


def _cfg(**kw: Any) -> PreemptionConfig:
    return PreemptionConfig.model_validate(kw)


def test_auto_builds_the_detected_clouds_sources(tmp_path: Path) -> None:
    gcp_dmi = _dmi(tmp_path / "gcp", MACHINES["gcp"][0])
    env = {"GCE_METADATA_HOST": "127.0.0.1:9"}
    sources = build_sources(_cfg(), env=env, dmi_dir=gcp_dmi)
    assert all(isinstance(s, GcpMetadataWatch) for s in sources)
    assert [getattr(s, "key", None) for s in sources] == [
        "instance/preempted",
        "instance/maintenance-event",
    ]
    bare = _dmi(tmp_path / "bare", MACHINES["bare-metal"][0])
    assert build_sources(_cfg(), env={}, dmi_dir=bare) == []


def test_explicit_source_ignores_dmi_and_trigger_file_is_always_added(tmp_path: Path) -> None:
    bare = _dmi(tmp_path / "bare", MACHINES["bare-metal"][0])
    trigger = tmp_path / "trigger"
    aws = build_sources(_cfg(source="aws", trigger_file=trigger), env={}, dmi_dir=bare)
    assert [type(s) for s in aws] == [AwsSpotSource, TriggerFileSource]
    azure = build_sources(_cfg(source="azure"), env={}, dmi_dir=bare)
    assert [type(s) for s in azure] == [AzureScheduledEventsSource]
    none = build_sources(_cfg(source="none", trigger_file=trigger), env={}, dmi_dir=bare)
    assert [type(s) for s in none] == [TriggerFileSource]


def test_gcp_maintenance_can_be_left_out(tmp_path: Path) -> None:
    sources = build_sources(_cfg(source="gcp", gcp={"maintenance": False}), env={})
    assert [getattr(s, "key", None) for s in sources] == ["instance/preempted"]


def test_bad_endpoint_is_refused_at_build_time() -> None:
    with pytest.raises(ValueError, match="http://host"):
        build_sources(_cfg(source="aws"), env={"AWS_EC2_METADATA_SERVICE_ENDPOINT": "ftp://x"})
