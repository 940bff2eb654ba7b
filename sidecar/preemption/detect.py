"""``preemption.source: auto``: which cloud this machine runs on, from DMI, without network.

Reads a few world-readable files under ``/sys/class/dmi/id`` (the directory is injectable
for tests). Nothing here talks to a metadata server: a probe would cost a timeout on every
start outside the cloud, and DMI is what the hypervisor itself says.

* AWS: ``sys_vendor`` ``Amazon EC2`` (Nitro), or ``bios_version`` containing ``amazon``
  (older Xen instances report ``Xen`` / ``HVM domU``).
* GCP: ``sys_vendor`` ``Google`` or ``product_name`` ``Google Compute Engine``.
* Azure: ``chassis_asset_tag`` ``7783-7084-3265-9085-8269-3286-77``, or ``sys_vendor``
  ``Microsoft Corporation`` with ``product_name`` ``Virtual Machine`` (Hyper-V).
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

__all__ = ["DMI_DIR", "Cloud", "detect_cloud"]

Cloud = Literal["aws", "gcp", "azure"]
DMI_DIR = Path("/sys/class/dmi/id")
AZURE_ASSET_TAG = "7783-7084-3265-9085-8269-3286-77"


def _read(dmi_dir: Path, name: str) -> str:
    try:
        return (dmi_dir / name).read_text(encoding="utf-8", errors="replace").strip()
    except OSError:
        return ""


def detect_cloud(dmi_dir: Path = DMI_DIR) -> Cloud | None:
    """The cloud named by DMI, or ``None`` (bare metal, another hypervisor, no ``/sys``)."""
    vendor = _read(dmi_dir, "sys_vendor")
    product = _read(dmi_dir, "product_name")
    if vendor == "Amazon EC2" or "amazon" in _read(dmi_dir, "bios_version").lower():
        return "aws"
    if vendor == "Google" or product == "Google Compute Engine":
        return "gcp"
    if _read(dmi_dir, "chassis_asset_tag") == AZURE_ASSET_TAG:
        return "azure"
    if vendor == "Microsoft Corporation" and product == "Virtual Machine":
        return "azure"
    return None
