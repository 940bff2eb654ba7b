"""Shared pieces of the issue-11 benchmarks: machine facts, data, servers, the daemon, tables.

Every scenario drives the real daemon (``python -m sidecar run``) through
``tests.e2e.harness.Daemon`` and reads its JSON log events; times come from the events'
``timestamp`` (UTC, microseconds) and this process's ``time.time()`` on the same machine.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import psutil

from tests.e2e.harness import Daemon, Event
from tests.servers.seaweedfs import S3Server, new_bucket, start_seaweedfs, stop_seaweedfs

KiB = 1024
MiB = 1024 * KiB
GiB = 1024 * MiB
BENCH = Path(__file__).resolve().parent
CHUNK = 64 * MiB


# ------------------------------------------------------------------ machine and reporting


def load() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


@dataclass
class Report:
    """What every scenario's JSON and Markdown header hold."""

    name: str
    started: str = field(default_factory=lambda: f"{datetime.now(UTC):%Y-%m-%d %H:%M} UTC")
    load_start: list[float] = field(default_factory=load)
    load_end: list[float] = field(default_factory=list)
    command: str = field(
        default_factory=lambda: (
            ".venv/bin/python -m bench."
            + Path(sys.argv[0]).stem
            + "".join(" " + shlex.quote(a) for a in sys.argv[1:])
        )
    )
    rows: list[dict[str, Any]] = field(default_factory=list)
    code: str = field(default_factory=lambda: code_version())

    def machine(self) -> str:
        mem = psutil.virtual_memory().total / GiB
        py = sys.version.split()[0]
        return f"{os.cpu_count()} cores, {mem:.0f} GiB RAM, {sys.platform}, Python {py}"

    def finish(self, table: str, extra: dict[str, Any] | None = None) -> None:
        """Print the Markdown header and table; write ``bench/<name>.json``."""
        self.load_end = load()
        print(f"\n{self.started}; {self.machine()}")
        print(f"load average (1, 5, 15 min): start {self.load_start}, end {self.load_end}")
        print(f"code: {self.code}")
        print(f"command: `{self.command}`\n")
        print(table)
        data = {
            "date": self.started,
            "machine": self.machine(),
            "load_start": self.load_start,
            "load_end": self.load_end,
            "command": self.command,
            "code": self.code,
            "rows": self.rows,
            **(extra or {}),
        }
        (BENCH / f"{self.name}.json").write_text(json.dumps(data, indent=1) + "\n")


def code_version() -> str:
    """The commit measured, and whether sidecar/ had uncommitted changes (read-only git)."""
    try:
        head = run_quiet(["git", "rev-parse", "--short", "HEAD"], cwd=BENCH.parent)
        dirty = run_quiet(["git", "status", "--porcelain", "sidecar"], cwd=BENCH.parent)
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    extra = " + uncommitted sidecar/ changes" if dirty.stdout else ""
    return head.stdout.decode().strip() + extra


def md_table(headers: list[str], rows: Sequence[Sequence[object]], right: int = 1) -> str:
    """A Markdown table; columns from ``right`` on are right-aligned."""
    align = ["---" if i < right else "---:" for i in range(len(headers))]
    lines = ["| " + " | ".join(headers) + " |", "|" + "|".join(align) + "|"]
    lines += ["| " + " | ".join(str(c) for c in r) + " |" for r in rows]
    return "\n".join(lines)


# ------------------------------------------------------------------------------- data


def spread_sizes(n: int, lo_mib: int, hi_mib: int, seed: int) -> list[int]:
    """``n`` sizes in whole MiB, uniform in [lo, hi], from a fixed seed."""
    rng = random.Random(seed)
    return [rng.randint(lo_mib, hi_mib) * MiB for _ in range(n)]


def write_file(path: Path, size: int, seed: int) -> None:
    """``size`` deterministic incompressible-looking bytes, written atomically.

    One 64 MiB block from ``random.Random(seed)`` per file, each chunk stamped with its index
    (so no two chunks of a file are equal); temp name in the same folder, then rename.
    """
    base = bytearray(random.Random(seed).randbytes(min(size, CHUNK)))
    tmp = path.with_name(f".{path.name}.writing")
    with open(tmp, "wb") as f:
        left, i = size, 0
        while left > 0:
            n = min(left, CHUNK)
            base[:8] = i.to_bytes(8, "little")
            f.write(memoryview(base)[:n])
            left -= n
            i += 1
    os.replace(tmp, path)


def write_folder(folder: Path, sizes: list[int], seed: int) -> None:
    """A folder of ``f00000.bin``... of the given sizes (created, not renamed)."""
    folder.mkdir(parents=True, exist_ok=True)
    small = [s for s in sizes if s <= 1 * MiB]
    blob = random.Random(seed).randbytes(max(small, default=0) + 8)
    for i, size in enumerate(sizes):
        p = folder / f"f{i:05d}.bin"
        if size <= 1 * MiB:
            p.write_bytes(i.to_bytes(8, "little") + blob[8:size])
        else:
            write_file(p, size, seed * 100_003 + i)


def tree_bytes(path: Path) -> int:
    if path.is_file():
        return path.stat().st_size
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def tree_files(path: Path) -> list[Path]:
    if path.is_file():
        return [path]
    return sorted(p for p in path.rglob("*") if p.is_file())


# ---------------------------------------------------------------------------- servers


@contextlib.contextmanager
def seaweedfs() -> Iterator[S3Server]:
    """A SeaweedFS (``weed mini``) in its own temp folder, stopped and removed at the end."""
    data = Path(tempfile.mkdtemp(prefix="bench-weed-"))
    server = start_seaweedfs(data)
    try:
        yield server
    finally:
        stop_seaweedfs(server)
        shutil.rmtree(data, ignore_errors=True)


def s3_env(server: S3Server, endpoint: str | None = None) -> dict[str, str]:
    """Environment for a daemon (or this process) that talks to ``server`` and nothing else."""
    env = server.env()
    if endpoint:
        env["AWS_ENDPOINT_URL_S3"] = endpoint
    env["AWS_CONFIG_FILE"] = os.devnull
    env["AWS_SHARED_CREDENTIALS_FILE"] = os.devnull
    return env


@dataclass
class Target:
    """A destination for one run: the URL and the env the daemon needs for it."""

    url: str
    env: dict[str, str]
    local: Path | None = None  # file:// only: the folder


def new_target(kind: str, work: Path, server: S3Server | None, stem: str) -> Target:
    """A fresh, empty destination: a new folder (``file``) or a new bucket (``s3``)."""
    if kind == "file":
        d = Path(tempfile.mkdtemp(prefix=f"{stem}-", dir=work))
        return Target(f"file://{d}", {}, d)
    assert server is not None
    return Target(f"s3://{new_bucket(server, stem)}/bench", s3_env(server))


def drop_target(t: Target, server: S3Server | None) -> None:
    """Delete a destination's objects (the bucket too) so the disk does not fill."""
    if t.local is not None:
        shutil.rmtree(t.local, ignore_errors=True)
        return
    assert server is not None
    bucket = t.url.removeprefix("s3://").split("/", 1)[0]
    c = server.client()
    try:
        for page in c.get_paginator("list_objects_v2").paginate(Bucket=bucket):
            keys = [{"Key": o["Key"]} for o in page.get("Contents", [])]
            for i in range(0, len(keys), 1000):
                c.delete_objects(Bucket=bucket, Delete={"Objects": keys[i : i + 1000]})
        c.delete_bucket(Bucket=bucket)
    finally:
        c.close()


# ----------------------------------------------------------------------------- daemon


def start_daemon(watch: Path, t: Target, env: dict[str, str] | None = None) -> Daemon:
    """The daemon on ``watch`` -> ``t``; the harness sets json logs, admin port 0, no
    preemption source and settle 0.5 s (``env`` overrides, e.g. back to the 1.0 default)."""
    return Daemon(watch, t.url, env={**t.env, **(env or {})})


def ts(ev: Event) -> float:
    """An event's wall time (its ISO ``timestamp``) as epoch seconds."""
    return datetime.fromisoformat(str(ev["timestamp"]).replace("Z", "+00:00")).timestamp()


def wait_until(d: Daemon, done: Callable[[list[Event]], bool], timeout: float) -> None:
    """Block until ``done(events)`` holds; AssertionError with the log tail on timeout."""
    end = time.monotonic() + timeout
    cond = d._cond
    with cond:
        while not done(d.events):
            left = end - time.monotonic()
            if left <= 0 or d.proc.poll() is not None:
                raise AssertionError("timed out; log tail:\n" + "".join(d.raw[-20:]))
            cond.wait(min(left, 0.5))


def stop_daemon(d: Daemon) -> None:
    try:
        d.terminate(60)
    except Exception:
        d.kill()
    finally:
        d.close()


_SETTLED = {"checkpoint.already_committed", "checkpoint.superseded", "checkpoint.committed"}


def converged(names: set[str]) -> Callable[[list[Event]], bool]:
    """True once every name in ``names`` was recognised as committed (or superseded by a
    newer one that was) and nothing is being uploaded."""

    def check(events: list[Event]) -> bool:
        settled = {str(e.get("checkpoint")) for e in events if e.get("event") in _SETTLED}
        return names <= settled

    return check


def tree_cpu(p: psutil.Process) -> float:
    """CPU seconds (user + system) of ``p`` and its reaped and living children."""
    t = p.cpu_times()
    total = t.user + t.system + t.children_user + t.children_system
    for c in p.children(recursive=True):
        with contextlib.suppress(psutil.Error):
            ct = c.cpu_times()
            total += ct.user + ct.system
    return float(total)


class RssSampler:
    """Peak RSS of a process and its children, sampled every ``interval`` seconds."""

    def __init__(self, pid: int, interval: float = 0.05) -> None:
        self.proc = psutil.Process(pid)
        self.interval = interval
        self.peak = 0
        self.samples = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                rss = self.proc.memory_info().rss
                for c in self.proc.children(recursive=True):
                    with contextlib.suppress(psutil.Error):
                        rss += c.memory_info().rss
            except psutil.Error:
                return
            self.peak = max(self.peak, rss)
            self.samples += 1
            self._stop.wait(self.interval)

    def stop(self) -> int:
        self._stop.set()
        self._thread.join(5)
        return self.peak


def measure_child(
    cmd: list[str], env: dict[str, str], server_pid: int, timeout: float, cwd: Path | None = None
) -> tuple[float, float, float, float] | str:
    """Run one upload tool as a child in its own session and measure it: (wall s, CPU s of
    the child and its reaped children from ``wait4``, CPU s of the server ``server_pid`` over
    the run, peak RSS MiB of the child's process tree, sampled: ``ru_maxrss`` would include
    the parent's, inherited at fork). On a non-zero exit or after ``timeout`` seconds (the
    session is killed) the stderr tail is returned instead, as text."""
    srv = psutil.Process(server_pid)
    before = sum(srv.cpu_times()[:2])
    with tempfile.TemporaryFile() as err_file:
        start = time.perf_counter()
        proc = subprocess.Popen(
            cmd,
            stdout=subprocess.DEVNULL,
            stderr=err_file,
            env=env,
            cwd=cwd,
            start_new_session=True,
        )
        sampler = RssSampler(proc.pid)
        killer = threading.Timer(timeout, os.killpg, (proc.pid, signal.SIGKILL))
        killer.start()
        _, status, usage = os.wait4(proc.pid, 0)
        seconds = time.perf_counter() - start
        killer.cancel()
        peak = sampler.stop()
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)  # what a tool left running in its session
        proc.returncode = os.waitstatus_to_exitcode(status)
        err_file.seek(0)
        err = err_file.read().decode(errors="replace").strip()
    if status != 0:
        why = "timed out" if seconds >= timeout else f"exit {proc.returncode}"
        return f"{why}: {' | '.join(err[-600:].splitlines())}"
    after = sum(srv.cpu_times()[:2])
    return seconds, usage.ru_utime + usage.ru_stime, after - before, peak / MiB


def run_quiet(cmd: list[str], **kw: Any) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(cmd, check=True, capture_output=True, **kw)


def build_committed(
    watch: Path, t: Target, checkpoints: int, files_each: int, size: int = 4 * KiB
) -> set[str]:
    """Fill ``watch`` with ``checkpoints`` folders ``step_NNNN`` of ``files_each`` files and
    have a daemon commit every one of them to ``t`` (queue and retention opened wide for this
    set-up run only, so none is superseded or pruned). Returns the checkpoint names."""
    staging = watch.parent / f".{watch.name}-staging"
    names = {f"step_{i + 1:04d}" for i in range(checkpoints)}
    for i, name in enumerate(sorted(names)):
        write_folder(staging / name, [size] * files_each, seed=1000 + i)
    watch.mkdir(parents=True, exist_ok=True)
    for name in names:
        os.rename(staging / name, watch / name)
    staging.rmdir()
    d = start_daemon(
        watch,
        t,
        {
            "CKPT_SIDECAR_WATCH__SETTLE_SECONDS": "0.2",
            "CKPT_SIDECAR_QUEUE__MAX_CHECKPOINTS": "100000",
            "CKPT_SIDECAR_RETENTION__KEEP_LAST": "100000",
        },
    )
    try:
        d.wait_for("daemon.ready", timeout=60)
        wait_until(d, converged(names), timeout=1800)
        committed = {str(e["checkpoint"]) for e in d.named("checkpoint.committed")}
        assert committed == names, f"set-up committed {len(committed)} of {len(names)}"
    finally:
        stop_daemon(d)
    return names
