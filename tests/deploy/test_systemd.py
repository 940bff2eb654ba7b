"""deploy/systemd: ``systemd-analyze verify`` and ``security`` on the units, plus the contract
(SIGTERM drain fits TimeoutStopSec, restore required before start, writable paths = the watched
folder).

``systemd-analyze verify`` checks that ExecStart's binary exists. The units name
/opt/ckpt-sidecar/bin/ckpt-sidecar, where the README installs it; the test verifies copies whose
only change is that path, pointed at this venv's real ``ckpt-sidecar``, and checks separately
that the unmodified units report nothing but that missing binary.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from sidecar.config_load import ConfigError, load
from tests.deploy.tools import DEPLOY, read_env_file, run, tool

UNITS = DEPLOY / "systemd"
SERVICE, RESTORE = "ckpt-sidecar.service", "ckpt-sidecar-restore.service"
INSTALLED = "/opt/ckpt-sidecar/bin/ckpt-sidecar"


def _real_binary() -> str:
    path = Path(sys.executable).parent / "ckpt-sidecar"
    assert path.is_file(), f"{path} missing: pip install -e . provides it"
    return str(path)


@pytest.fixture
def unit_copies(tmp_path: Path) -> Path:
    for name in (SERVICE, RESTORE):
        text = (UNITS / name).read_text(encoding="utf-8")
        assert INSTALLED in text
        (tmp_path / name).write_text(text.replace(INSTALLED, _real_binary()), encoding="utf-8")
    return tmp_path


def _parse(path: Path) -> dict[str, dict[str, list[str]]]:
    """Sections -> key -> every value in order (systemd allows repeated keys)."""
    out: dict[str, dict[str, list[str]]] = {}
    section = ""
    for line in path.read_text(encoding="utf-8").splitlines():
        text = line.strip()
        if not text or text.startswith(("#", ";")):
            continue
        if text.startswith("["):
            section = text.strip("[]")
            out.setdefault(section, {})
            continue
        key, _, value = text.partition("=")
        out[section].setdefault(key, []).append(value)
    return out


def _seconds(value: str) -> float:
    units = {"s": 1, "sec": 1, "min": 60, "m": 60, "h": 3600}
    for suffix, factor in sorted(units.items(), key=lambda kv: -len(kv[0])):
        if value.endswith(suffix):
            return float(value[: -len(suffix)]) * factor
    return float(value)


def test_systemd_analyze_verify_is_clean(unit_copies: Path) -> None:
    proc = run(
        [tool("systemd-analyze"), "verify", "--man=no", f"./{SERVICE}", f"./{RESTORE}"],
        cwd=unit_copies,
    )
    assert proc.returncode == 0 and not proc.stdout.strip() and not proc.stderr.strip(), (
        proc.stdout + proc.stderr
    )


def test_unmodified_units_only_lack_the_installed_binary() -> None:
    for name in (SERVICE, RESTORE):
        proc = run([tool("systemd-analyze"), "verify", "--man=no", str(UNITS / name)], cwd=UNITS)
        lines = [ln for ln in (proc.stdout + proc.stderr).splitlines() if ln.strip()]
        assert lines, "expected the missing /opt binary to be reported"
        assert all(INSTALLED in ln and "not executable" in ln for ln in lines), lines


def test_verify_catches_a_misspelt_directive(unit_copies: Path) -> None:
    unit = unit_copies / SERVICE
    unit.write_text(unit.read_text().replace("ProtectHome=yes", "ProtectHom=yes"))
    proc = run([tool("systemd-analyze"), "verify", "--man=no", f"./{SERVICE}"], cwd=unit_copies)
    assert "ProtectHom" in proc.stderr


@pytest.mark.parametrize("name", [SERVICE, RESTORE])
def test_security_exposure_is_low(unit_copies: Path, name: str) -> None:
    # --threshold is in tenths: exposure 2.0 or less ("OK" in systemd's scale) passes.
    proc = run(
        [tool("systemd-analyze"), "security", "--offline=true", "--threshold=20", f"./{name}"],
        cwd=unit_copies,
    )
    last = proc.stdout.strip().splitlines()[-1] if proc.stdout.strip() else proc.stderr
    assert proc.returncode == 0, last


def test_stop_covers_the_drain_and_hardening_is_on() -> None:
    unit = _parse(UNITS / SERVICE)
    service = unit["Service"]
    env = read_env_file(UNITS / "ckpt-sidecar.env")
    grace = float(env["CKPT_SIDECAR_SHUTDOWN_GRACE_SECONDS"])
    assert service["KillSignal"] == ["SIGTERM"]
    assert _seconds(service["TimeoutStopSec"][-1]) >= grace + 15, "SIGKILL would cut the drain"
    assert service["Restart"] == ["on-failure"]
    assert service["ExecStart"] == [f"{INSTALLED} run"]
    for key, value in {
        "NoNewPrivileges": "yes",
        "ProtectSystem": "strict",
        "ProtectHome": "yes",
        "PrivateTmp": "yes",
        "CapabilityBoundingSet": "",
    }.items():
        assert service[key] == [value], key
    assert service["User"][0] not in ("", "root")
    assert service["ReadWritePaths"] == [env["CKPT_SIDECAR_WATCH__PATH"]]
    assert "CKPT_SIDECAR_STATE__DIR=%S/ckpt-sidecar" in service["Environment"]
    assert service["StateDirectory"] == ["ckpt-sidecar"]
    assert RESTORE in unit["Unit"]["After"][0].split()
    # Requires=, not Wants=: a failed restore must not let the daemon start on an empty folder.
    assert RESTORE in unit["Unit"]["Requires"][0].split()


def test_restore_unit_runs_once_before_training() -> None:
    service = _parse(UNITS / RESTORE)["Service"]
    assert service["Type"] == ["oneshot"] and service["RemainAfterExit"] == ["yes"]
    assert service["ExecStart"] == [
        f"{INSTALLED} restore --to ${{CKPT_SIDECAR_WATCH__PATH}} --allow-empty"
    ]
    assert _seconds(service["TimeoutStartSec"][0]) >= 3600, "large restores outlast 90 s"
    daemon = _parse(UNITS / SERVICE)["Service"]
    assert service["User"] == daemon["User"]
    state = [e for e in service["Environment"] if e.startswith("CKPT_SIDECAR_STATE__DIR=")]
    assert state == [e for e in daemon["Environment"] if e.startswith("CKPT_SIDECAR_STATE__DIR=")]


def test_environment_file_loads_with_the_real_config() -> None:
    env = read_env_file(UNITS / "ckpt-sidecar.env")
    env["CKPT_SIDECAR_STATE__DIR"] = "/var/lib/ckpt-sidecar"
    try:
        cfg = load(env=env)
    except ConfigError as e:
        pytest.fail(f"the daemon would exit 2:\n{e}")
    assert cfg.destination.url.endswith("/node-0")
    assert cfg.admin.host == "127.0.0.1"
    assert cfg.preemption.source == "auto"
