"""The daemon as a subprocess, and a writer that behaves like a trainer."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from sidecar.manifest import MANIFEST_PREFIX, Manifest, parse
from sidecar.storage.checksum import crc32c_of_file

Event = dict[str, Any]


class Daemon:
    """``python -m sidecar run`` with the given env; its JSON log lines are collected."""

    def __init__(
        self,
        watch: Path,
        destination: str,
        env: dict[str, str] | None = None,
        args: list[str] | None = None,
        wrap: list[str] | None = None,
    ) -> None:
        """``wrap`` runs the daemon under another command (e.g. ``setpriv`` to drop root)."""
        self.events: list[Event] = []
        self.raw: list[str] = []
        self._cond = threading.Condition()
        full_env = {k: v for k, v in os.environ.items() if not k.startswith("CKPT_SIDECAR_")}
        full_env.update(
            {
                "CKPT_SIDECAR_LOG__FORMAT": "json",
                "CKPT_SIDECAR_ADMIN__PORT": "0",
                "CKPT_SIDECAR_WATCH__SETTLE_SECONDS": "0.5",
                "CKPT_SIDECAR_PREEMPTION__SOURCE": "none",
            }
        )
        full_env.update(env or {})
        cmd = [
            *(wrap or []),
            sys.executable,
            "-m",
            "sidecar",
            "run",
            "--watch",
            str(watch),
            "--destination",
            destination,
            *(args or []),
        ]
        self.proc = subprocess.Popen(
            cmd, env=full_env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
        )
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            with self._cond:
                self.raw.append(line)
                try:
                    ev = json.loads(line)
                except ValueError:
                    ev = None
                if isinstance(ev, dict):
                    self.events.append(ev)
                self._cond.notify_all()
        with self._cond:
            self._cond.notify_all()

    def wait_for(
        self,
        event: str | tuple[str, ...],
        timeout: float = 20.0,
        where: Callable[[Event], bool] = lambda e: True,
    ) -> Event:
        """The first log event named ``event`` (or any of several names) matching ``where``;
        AssertionError on timeout."""
        names = (event,) if isinstance(event, str) else event
        end = time.monotonic() + timeout
        with self._cond:
            while True:
                for ev in self.events:
                    if ev.get("event") in names and where(ev):
                        return ev
                left = end - time.monotonic()
                if left <= 0 or (self.proc.poll() is not None and not self._reader.is_alive()):
                    raise AssertionError(
                        f"no {event!r} within {timeout}s; log tail:\n" + "".join(self.raw[-30:])
                    )
                self._cond.wait(min(left, 0.5))

    def named(self, event: str) -> list[Event]:
        with self._cond:
            return [e for e in self.events if e.get("event") == event]

    @property
    def admin_port(self) -> int:
        return int(self.wait_for("admin.listening")["port"])

    def terminate(self, timeout: float = 30.0) -> int:
        self.proc.send_signal(signal.SIGTERM)
        return self.proc.wait(timeout)

    def kill(self) -> None:
        self.proc.kill()
        self.proc.wait(10)

    def close(self) -> None:
        if self.proc.poll() is None:
            self.kill()
        self._reader.join(5)
        if self.proc.stdout is not None:
            self.proc.stdout.close()


def admin_get(port: int, path: str) -> tuple[int, bytes]:
    """GET ``path`` on the daemon's admin port: the status and the body, also for 4xx/5xx."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


def scrape(port: int) -> dict[str, float]:
    """Every sample of the daemon's ``/metrics`` as ``name{labels}`` -> value."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
        body = r.read().decode()
    out = {}
    for fam in text_string_to_metric_families(body):
        for s in fam.samples:
            labels = ",".join(f"{k}={v}" for k, v in sorted(s.labels.items()))
            out[f"{s.name}{{{labels}}}"] = s.value
    return out


def cli(
    *args: str, env: dict[str, str] | None = None, cwd: Path | None = None, timeout: float = 180
) -> subprocess.CompletedProcess[str]:
    """``python -m sidecar ARGS``; this environment minus ``CKPT_SIDECAR_*``, plus ``env``."""
    full = {k: v for k, v in os.environ.items() if not k.startswith("CKPT_SIDECAR_")}
    full.update(env or {})
    return subprocess.run(
        [sys.executable, "-m", "sidecar", *args],
        capture_output=True,
        text=True,
        env=full,
        timeout=timeout,
        cwd=cwd,
    )


def spawn_cli(*args: str, env: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
    """``python -m sidecar ARGS`` in the background (to kill it midway), output discarded;
    the environment as for :func:`cli`."""
    full = {k: v for k, v in os.environ.items() if not k.startswith("CKPT_SIDECAR_")}
    full.update(env or {})
    return subprocess.Popen(
        [sys.executable, "-m", "sidecar", *args],
        env=full,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )


def checkpoint_is(name: str) -> Callable[[Event], bool]:
    return lambda e: e.get("checkpoint") == name


def step_at_least(step: int) -> Callable[[Event], bool]:
    return lambda e: isinstance(e.get("step"), int) and e["step"] >= step


def write_atomic(path: Path, data: bytes) -> None:
    """What a careful trainer does: temporary name, fsync, rename."""
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def manifests(remote: Path) -> list[Manifest]:
    folder = remote / MANIFEST_PREFIX
    if not folder.is_dir():
        return []
    return [parse(p.read_bytes(), where=str(p)) for p in sorted(folder.glob("*.json"))]


def assert_invariant(remote: Path) -> list[Manifest]:
    """Every manifest names only objects that exist with the recorded size and CRC32C."""
    found = manifests(remote)
    for m in found:
        for f in m.files:
            obj = remote / f.key
            assert obj.is_file(), f"{m.key} names missing object {f.key}"
            assert obj.stat().st_size == f.size, f"{f.key}: size differs from {m.key}"
            assert crc32c_of_file(obj) == f.crc32c, f"{f.key}: CRC32C differs from {m.key}"
    return found


def same_tree(a: Path, b: Path) -> bool:
    """Byte-identical files (a single file, or every file of two folders)."""
    if a.is_file():
        return b.is_file() and a.read_bytes() == b.read_bytes()
    fa = sorted(p.relative_to(a) for p in a.rglob("*") if p.is_file())
    fb = sorted(p.relative_to(b) for p in b.rglob("*") if p.is_file())
    return fa == fb and all((a / r).read_bytes() == (b / r).read_bytes() for r in fa)
