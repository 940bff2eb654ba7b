"""Dockerfile and .dockerignore: hadolint, and the image's contract with the daemon and the pod.

No Docker engine runs here; what the image does at run time is exercised by test_wheel.py
(the same wheel, the same pinned dependencies, in a fresh venv).
"""

from __future__ import annotations

import json
import tomllib
from pathlib import Path

import pytest
from packaging.requirements import Requirement

from sidecar.config import Config
from sidecar.config_load import ConfigError, load
from tests.deploy.tools import (
    ROOT,
    dockerfile_constraints,
    dockerfile_final_stage,
    dockerfile_user,
    normalise,
    run,
    tool,
)

DOCKERFILE = ROOT / "Dockerfile"
# Not "crt": the S3 uploads never use the CRT transfer client, and awscrt is a base dependency.
EXTRAS = ("azure-identity",)


def _final(word: str) -> list[str]:
    return [args for w, args in dockerfile_final_stage() if w == word]


def test_hadolint_is_clean() -> None:
    proc = run(
        [
            tool("hadolint"),
            "--no-color",
            "--failure-threshold=info",
            "--require-label=org.opencontainers.image.title:text",
            "--require-label=org.opencontainers.image.licenses:spdx",
            str(DOCKERFILE),
        ]
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_hadolint_reports_a_non_numeric_user(tmp_path: Path) -> None:
    bad = DOCKERFILE.read_text().replace("USER 10001:10001", "USER ckpt")
    path = tmp_path / "Dockerfile"
    path.write_text(bad)
    proc = run([tool("hadolint"), "--no-color", str(path)])
    assert proc.returncode != 0 and "DL3066" in proc.stdout


def test_runs_the_daemon_as_a_numeric_non_root_user() -> None:
    uid, gid = dockerfile_user()
    assert uid != 0 and gid != 0
    assert _final("ENTRYPOINT") == ['["ckpt-sidecar"]']
    assert _final("CMD") == ['["run"]']
    assert _final("STOPSIGNAL") == ["SIGTERM"]


def test_read_only_root_works_through_declared_volumes() -> None:
    (volumes,) = _final("VOLUME")
    declared = set(json.loads(volumes))
    env = dict(kv.split("=", 1) for args in _final("ENV") for kv in args.split())
    cfg = load(env={k: v for k, v in env.items() if k.startswith("CKPT_SIDECAR_")})
    # Everything the daemon writes: the watched root (notice file, restore temp), the state
    # cache (default under the watched root), /tmp, and HOME.
    assert str(cfg.watch.path) in declared
    assert any(str(cfg.state_dir).startswith(v + "/") for v in declared)
    assert "/tmp" in declared and env["HOME"] == "/tmp"


def test_exposes_the_admin_port_on_all_interfaces() -> None:
    env = dict(kv.split("=", 1) for args in _final("ENV") for kv in args.split())
    try:
        cfg = load(env={k: v for k, v in env.items() if k.startswith("CKPT_SIDECAR_")})
    except ConfigError as e:
        pytest.fail(str(e))
    assert _final("EXPOSE") == [str(cfg.admin.port)]
    assert cfg.admin.port == Config().admin.port, "the image keeps the documented default port"
    assert cfg.admin.host == "0.0.0.0"


def test_every_dependency_is_pinned_within_pyproject() -> None:
    pins = dockerfile_constraints()
    project = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    wanted = list(project["dependencies"])
    for extra in EXTRAS:
        wanted += project["optional-dependencies"][extra]
    for text in wanted:
        req = Requirement(text)
        name = normalise(req.name)
        assert name in pins, f"{name} is not pinned in the Dockerfile"
        assert req.specifier.contains(pins[name], prereleases=True), (
            f"{name}=={pins[name]} does not satisfy pyproject's {req}"
        )
    text = DOCKERFILE.read_text(encoding="utf-8")
    assert f"ARG EXTRAS={','.join(EXTRAS)}\n" in text and "[${EXTRAS}]" in text


def test_dockerignore_keeps_only_what_the_build_copies() -> None:
    rules = [
        ln.strip()
        for ln in (ROOT / ".dockerignore").read_text(encoding="utf-8").splitlines()
        if ln.strip() and not ln.startswith("#")
    ]
    assert rules[0] == "*", "exclude everything first (no .venv, .git, tests or secrets)"
    kept = {r[1:].rstrip("/") for r in rules if r.startswith("!")}
    text = DOCKERFILE.read_text(encoding="utf-8")
    sources: set[str] = set()
    for line in text.splitlines():
        words = line.split()
        if words[:1] == ["COPY"] and not any(w.startswith(("--from", "<<")) for w in words):
            sources.update(w.rstrip("/") for w in words[1:-1])
    assert sources == kept, f"COPY sources {sources} vs .dockerignore exceptions {kept}"
    for source in sources:
        assert (ROOT / source).exists(), f"COPY {source}: not in the repository"
