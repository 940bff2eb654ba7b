"""What the container image does, without a Docker engine: build the wheel from exactly the files
the Docker build context holds, install it with the Dockerfile's pinned constraints into a fresh
venv (dependencies from the package index), then run ``ckpt-sidecar --help`` and a short daemon
session: a checkpoint copied into the watched folder is committed at the destination, and
SIGTERM ends the daemon with status 0.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.deploy.tools import ROOT, dockerfile_constraints, normalise, run
from tests.servers.ports import free_port

pytestmark = pytest.mark.wheel

EXTRAS = "azure-identity"  # the Dockerfile's ARG EXTRAS
BUILD_CONTEXT = ("pyproject.toml", "README.md", "sidecar")


def _wait_for(predicate: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout:.0f} s waiting for {what}")
        time.sleep(0.1)


def _clean_env(**extra: str) -> dict[str, str]:
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("CKPT_SIDECAR_", "VIRTUAL_ENV", "PYTHON"))
    }
    env.update(extra)
    return env


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The fresh venv's bin directory, with the wheel and its pinned dependencies installed."""
    work = tmp_path_factory.mktemp("wheel")
    context = work / "context"
    context.mkdir()
    for name in BUILD_CONTEXT:
        src = ROOT / name
        if src.is_dir():
            shutil.copytree(src, context / name, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            shutil.copy2(src, context / name)
    dist = work / "dist"
    built = run(
        [sys.executable, "-m", "build", "--wheel", "--outdir", str(dist), str(context)], timeout=300
    )
    assert built.returncode == 0, built.stdout[-3000:] + built.stderr[-3000:]
    (wheel,) = dist.glob("ckpt_sidecar-*.whl")

    venv = work / "venv"
    made = run([sys.executable, "-m", "venv", str(venv)])
    assert made.returncode == 0, made.stderr
    constraints = work / "constraints.txt"
    pins = dockerfile_constraints()
    constraints.write_text("".join(f"{n}=={v}\n" for n, v in pins.items()))
    report = work / "report.json"
    pip = run(
        [
            str(venv / "bin" / "python"),
            "-m",
            "pip",
            "install",
            "--disable-pip-version-check",
            "--constraint",
            str(constraints),
            "--report",
            str(report),
            f"{wheel}[{EXTRAS}]",
        ],
        timeout=600,
    )
    assert pip.returncode == 0, pip.stdout[-3000:] + pip.stderr[-3000:]
    installed = {
        normalise(i["metadata"]["name"]): i["metadata"]["version"]
        for i in json.loads(report.read_text())["install"]
    }
    assert installed.pop("ckpt-sidecar") == "0.1.0"
    unpinned = {n: v for n, v in installed.items() if pins.get(n) != v}
    assert not unpinned, f"the Dockerfile's constraints miss {unpinned}"
    return venv / "bin"


def test_help_lists_every_subcommand(installed: Path) -> None:
    proc = run([str(installed / "ckpt-sidecar"), "--help"], cwd=installed)
    assert proc.returncode == 0, proc.stderr
    for sub in ("run", "restore", "list", "verify", "drain", "config"):
        assert sub in proc.stdout, f"--help does not mention {sub}"
    module = run([str(installed / "python"), "-m", "sidecar", "--help"], cwd=installed)
    assert module.returncode == 0 and module.stdout == proc.stdout


def test_daemon_commits_a_checkpoint_and_exits_0_on_sigterm(
    installed: Path, tmp_path: Path
) -> None:
    watch, remote = tmp_path / "ckpt", tmp_path / "remote"
    watch.mkdir()
    payload = tmp_path / "payload.bin"
    payload.write_bytes(os.urandom(256 * 1024))
    log = (tmp_path / "daemon.log").open("wb")
    daemon = subprocess.Popen(
        [
            str(installed / "ckpt-sidecar"),
            "run",
            "--watch",
            str(watch),
            "--destination",
            f"file://{remote}",
        ],
        cwd=tmp_path,
        stdout=log,
        stderr=subprocess.STDOUT,
        env=_clean_env(
            CKPT_SIDECAR_ADMIN__PORT=str(free_port()),
            CKPT_SIDECAR_PREEMPTION__SOURCE="none",
            CKPT_SIDECAR_LOG__FORMAT="json",
        ),
    )
    try:
        manifest = remote / ".ckpt-sidecar" / "manifests" / "step_1.pt.json"
        shutil.copyfile(payload, watch / "step_1.pt")
        _wait_for(
            lambda: manifest.exists() or daemon.poll() is not None, 60, "the manifest of step_1.pt"
        )
        assert daemon.poll() is None, "the daemon exited early"
        assert (remote / "step_1.pt").read_bytes() == payload.read_bytes()
        assert json.loads(manifest.read_text())  # a complete JSON document, written last
        daemon.send_signal(signal.SIGTERM)
        assert daemon.wait(timeout=60) == 0
    except BaseException:
        print((tmp_path / "daemon.log").read_text(errors="replace")[-5000:])
        raise
    finally:
        if daemon.poll() is None:
            daemon.kill()
            daemon.wait()
        log.close()
