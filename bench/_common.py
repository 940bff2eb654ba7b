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
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from urllib.parse import quote

import psutil

from bench._child import parse_setup_cpu
from sidecar.config import DestinationConfig
from sidecar.storage.base import Backend
from sidecar.storage.options import AzureOptions
from sidecar.storage.registry import open_backend
from tests.e2e.harness import Daemon, Event
from tests.servers.azurite import KEY, Azurite, start_azurite
from tests.servers.gcs import GcsServer, start_gcp_storage_emulator
from tests.servers.gcs import stop as stop_gcs
from tests.servers.ports import answers, free_port
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
    sidecar_diff: str = field(default_factory=lambda: sidecar_diff_stat())

    def machine(self) -> str:
        mem = psutil.virtual_memory().total / GiB
        py = sys.version.split()[0]
        return f"{os.cpu_count()} cores, {mem:.0f} GiB RAM, {sys.platform}, Python {py}"

    def finish_uploads(
        self,
        lines: list[str],
        rows: list[dict[str, Any]],
        not_measured: list[str],
        merge_on: Sequence[str],
    ) -> None:
        """:meth:`finish` for a benchmark of tools: ``lines`` (the table) with every case that
        was not measured listed under it, also kept in the JSON as ``not_measured``."""
        self.rows = rows
        table = "\n".join([*lines, *(f"* not measured: {line}" for line in not_measured)])
        self.finish(table, extra={"not_measured": not_measured}, merge_on=merge_on)

    def finish(
        self,
        table: str,
        extra: dict[str, Any] | None = None,
        merge_on: Sequence[str] = (),
    ) -> None:
        """Print the Markdown header and table; write ``bench/<name>.json``.

        Without ``merge_on`` the file holds this run only. With it (the row keys naming a
        measured case, the destination first), the file is a list of runs, each with its own
        date, command, load and code: rows of earlier runs are kept unless this run measured
        the same case, so a run of ``--backends gcs,azure`` leaves the ``file``/``s3``
        results of an earlier run, and their date, as they were.
        """
        self.load_end = load()
        ended = f"{datetime.now(UTC):%Y-%m-%d %H:%M} UTC"
        print(f"\n{self.started} - {ended}; {self.machine()}")
        print(f"load average (1, 5, 15 min): start {self.load_start}, end {self.load_end}")
        print(f"code: {self.code}")
        if self.sidecar_diff:
            print("git diff --stat HEAD -- sidecar (at the start):")
            print("\n".join("    " + line for line in self.sidecar_diff.splitlines()))
        print(f"command: `{self.command}`\n")
        print(table)
        data = {
            "date": self.started,
            "ended": ended,
            "machine": self.machine(),
            "load_start": self.load_start,
            "load_end": self.load_end,
            "command": self.command,
            "code": self.code,
            "sidecar_diff_stat": self.sidecar_diff,
            "rows": self.rows,
            **(extra or {}),
        }
        path = BENCH / f"{self.name}.json"
        if not merge_on:
            path.write_text(json.dumps(data, indent=1) + "\n")
            return

        def case(r: dict[str, Any]) -> tuple[str, ...]:
            return tuple(str(r.get(k)) for k in merge_on)

        measured = {case(r) for r in self.rows}
        runs = []
        for old in earlier_runs(path):
            old["rows"] = [r for r in old.get("rows", []) if case(r) not in measured]
            if old["rows"]:
                runs.append(old)
        runs.append(data)
        path.write_text(json.dumps({"runs": runs}, indent=1) + "\n")
        for old in runs[:-1]:
            kept = sorted({str(r.get(merge_on[0])) for r in old["rows"]})
            print(f"kept in {path.name}: {', '.join(kept)} of {old['date']} `{old['command']}`")


def earlier_runs(path: Path) -> list[dict[str, Any]]:
    """The runs in an existing ``bench/<name>.json``: a ``{"runs": [...]}`` file, or the
    older one-run layout (top-level ``date``, ``command``, ``rows``) as one run."""
    if not path.exists():
        return []
    data = json.loads(path.read_text())
    if isinstance(data, dict) and isinstance(data.get("runs"), list):
        return [dict(r) for r in data["runs"]]
    return [dict(data)] if isinstance(data, dict) and "rows" in data else []


def sidecar_diff_stat() -> str:
    """``git diff --stat HEAD -- sidecar``: the uncommitted code a figure was measured on."""
    try:
        out = run_quiet(["git", "diff", "--stat", "HEAD", "--", "sidecar"], cwd=BENCH.parent)
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    return out.stdout.decode().rstrip()


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


#: what ``store(kind)`` yields: the running server of a destination kind (None for file://)
Store = S3Server | GcsServer | Azurite | None
_ROOT = Path(__file__).resolve().parent.parent
#: the GCS emulators ``store("gcs", ...)`` can start
GCS_EMULATORS = ("fake-gcs-server", "gcp-storage-emulator")
#: ``store("gcs", GCS_LOOK_ALIKE)``: the tests' GCS look-alike in its own process, keeping
#: no object bytes (tests/servers/gcs.py, ``--sink``), for what no emulator can hold: it
#: speaks the XML multipart API that real GCS uses for files of 1 GiB or more, checks
#: every part's CRC32C and gives the object the CRC32C of its parts. Not a store to time:
#: one Python process on this machine's cores.
GCS_LOOK_ALIKE = "look-alike"
#: what a daemon on the look-alike is told, so that it uploads as on real GCS: XML
#: multipart from 1 GiB (``sidecar.storage.gcs.XML_AUTO_THRESHOLD``; an emulator host
#: turns it off unless set)
LOOK_ALIKE_ENV = {"CKPT_SIDECAR_DESTINATION__GCS__XML_MULTIPART_THRESHOLD_BYTES": str(1 << 30)}
KINDS = {
    "file": "file://",
    "s3": "S3 (SeaweedFS)",
    "gcs": "GCS",
    "azure": "Azure (Azurite)",
}


def _wait_answers(url: str, proc: subprocess.Popen[bytes], log: Path, what: str) -> None:
    deadline = time.monotonic() + 60
    while not answers(url, timeout=2):
        if proc.poll() is not None or time.monotonic() > deadline:
            tail = log.read_text(errors="replace")[-2000:]
            raise RuntimeError(f"{what} did not answer on {url} (exit {proc.poll()}): {tail}")
        time.sleep(0.1)


def start_fake_gcs_on_disk(data: Path) -> GcsServer:
    """fake-gcs-server with ``-backend filesystem`` under ``data``: finished objects are kept
    on disk (tests/servers/gcs.py starts it with ``-backend memory``). An upload in progress
    is still held in its memory, whole (v1.54 ``uploadFileContent`` appends every request's
    body to the object's content and hashes it all again)."""
    from tests.servers.gcs import _fake_gcs_binary

    port = free_port()
    url = f"http://127.0.0.1:{port}"
    log = data / "fake-gcs-server.log"
    args = [
        str(_fake_gcs_binary()),
        "-scheme", "http", "-host", "127.0.0.1", "-port", str(port),
        "-backend", "filesystem", "-filesystem-root", str(data / "root"),
        "-external-url", url, "-log-level", "warn",
    ]  # fmt: skip
    return _start_gcs("fake-gcs-server", args, url, log, "/storage/v1/b")


def start_gcs_look_alike(data: Path) -> GcsServer:
    """The tests' GCS look-alike in sink mode, in its own process (see GCS_LOOK_ALIKE)."""
    port = free_port()
    args = [sys.executable, "-m", "tests.servers.gcs", "--sink", "--port", str(port)]
    url = f"http://127.0.0.1:{port}"
    return _start_gcs(GCS_LOOK_ALIKE, args, url, data / "gcs-look-alike.log", "/storage/v1/b/x")


def _start_gcs(name: str, args: list[str], url: str, log: Path, probe: str) -> GcsServer:
    """Start ``args`` (a GCS server at ``url``) in its own session, logging to ``log``; once
    ``url + probe`` answers, the server. Raises RuntimeError (the log's tail) if it does not."""
    env = {k: v for k, v in os.environ.items() if k != "STORAGE_EMULATOR_HOST"}
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            args, stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True, cwd=_ROOT
        )
    server = GcsServer(name, url, proc, log)
    try:
        _wait_answers(url + probe, proc, log, name)
    except BaseException:
        stop_gcs(server)
        raise
    return server


@contextlib.contextmanager
def store(kind: str, gcs_emulator: str = "fake-gcs-server") -> Iterator[Store]:
    """The server a destination kind needs, in its own temp folder, stopped and removed at
    the end: none (``file``), SeaweedFS (``s3``), a GCS emulator (``gcs``: ``gcs_emulator``,
    fake-gcs-server on disk or gcp-storage-emulator in memory) or Azurite on disk (``azure``).
    """
    if kind == "file":
        yield None
        return
    if kind == "s3":
        with seaweedfs() as s3:
            yield s3
        return
    if kind not in KINDS:
        raise ValueError(f"unknown destination kind {kind!r}; one of {', '.join(KINDS)}")
    data = Path(tempfile.mkdtemp(prefix=f"bench-{kind}-"))
    try:
        if kind == "azure":
            with start_azurite(data, on_disk=True) as az:  # blobs on disk, not in RAM
                yield az
            return
        if gcs_emulator not in (*GCS_EMULATORS, GCS_LOOK_ALIKE):
            raise ValueError(f"unknown GCS emulator {gcs_emulator!r}")
        if gcs_emulator == GCS_LOOK_ALIKE:
            gcs = start_gcs_look_alike(data)
        elif gcs_emulator == "fake-gcs-server":
            gcs = start_fake_gcs_on_disk(data)
        else:
            gcs = start_gcp_storage_emulator(data)  # --in-memory
        try:
            yield gcs
        finally:
            stop_gcs(gcs)
    finally:
        shutil.rmtree(data, ignore_errors=True)


def store_pid(server: Store) -> int | None:
    """The server's process id (for its CPU and RSS), if it runs as one."""
    if isinstance(server, S3Server | GcsServer):
        return server.process.pid
    if isinstance(server, Azurite):
        return server.pid
    return None


def store_label(kind: str, server: Store) -> str:
    if isinstance(server, GcsServer):
        return f"GCS ({server.name})"
    return KINDS.get(kind, kind)


@dataclass
class Target:
    """A destination for one run: the URL and the env the daemon needs for it."""

    url: str
    env: dict[str, str]
    local: Path | None = None  # file:// only: the folder
    azure: AzureOptions | None = None  # az:// only: the options the env sets, for in-process

    def backend(self) -> Backend:
        """The same backend class the daemon uses for this destination, in this process
        (the target's non-``CKPT_SIDECAR_`` variables are put into ``os.environ`` first)."""
        os.environ.update({k: v for k, v in self.env.items() if not k.startswith("CKPT_")})
        return open_backend(DestinationConfig(url=self.url, azure=self.azure or AzureOptions()))


def new_target(kind: str, work: Path, server: Store, stem: str) -> Target:
    """A fresh, empty destination: a new folder (``file``), bucket (``s3``, ``gcs``) or
    container (``azure``)."""
    if kind == "file":
        d = Path(tempfile.mkdtemp(prefix=f"{stem}-", dir=work))
        return Target(f"file://{d}", {}, d)
    if kind == "gcs":
        assert isinstance(server, GcsServer)
        env = {"STORAGE_EMULATOR_HOST": server.url}
        if server.name == GCS_LOOK_ALIKE:
            env.update(LOOK_ALIKE_ENV)
        return Target(f"gs://{server.new_bucket(stem)}/bench", env)
    if kind == "azure":
        assert isinstance(server, Azurite)
        env = {
            "CKPT_SIDECAR_DESTINATION__AZURE__ACCOUNT_URL": server.account_url,
            "CKPT_SIDECAR_DESTINATION__AZURE__ACCOUNT_KEY": KEY,
        }
        opts = AzureOptions.model_validate({"account_url": server.account_url, "account_key": KEY})
        return Target(f"az://{server.new_container()}/bench", env, azure=opts)
    assert isinstance(server, S3Server)
    return Target(f"s3://{new_bucket(server, stem)}/bench", s3_env(server))


def drop_target(t: Target, server: Store) -> None:
    """Delete a destination's objects (the bucket or container too) so the disk does not
    fill."""
    if t.local is not None:
        shutil.rmtree(t.local, ignore_errors=True)
        return
    bucket = t.url.split("://", 1)[1].split("/", 1)[0]
    if isinstance(server, Azurite):
        server.delete_container(bucket)
        return
    if isinstance(server, GcsServer):
        _drop_gcs_bucket(server.url, bucket)
        return
    assert isinstance(server, S3Server)
    c = server.client()
    try:
        for page in c.get_paginator("list_objects_v2").paginate(Bucket=bucket):
            keys = [{"Key": o["Key"]} for o in page.get("Contents", [])]
            for i in range(0, len(keys), 1000):
                c.delete_objects(Bucket=bucket, Delete={"Objects": keys[i : i + 1000]})
        c.delete_bucket(Bucket=bucket)
    finally:
        c.close()


def _drop_gcs_bucket(host: str, bucket: str) -> None:
    """Every object of ``bucket`` deleted through the JSON API (8 at a time), then the bucket."""
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    base = f"{host}/storage/v1/b/{quote(bucket, safe='')}"

    def call(method: str, url: str) -> bytes:
        with opener.open(urllib.request.Request(url, method=method), timeout=60) as resp:
            body: bytes = resp.read()
            return body

    names: list[str] = []
    token = ""
    while True:
        page = json.loads(call("GET", f"{base}/o?maxResults=1000&pageToken={quote(token)}"))
        names += [str(o["name"]) for o in page.get("items", [])]
        token = page.get("nextPageToken") or ""
        if not token:
            break
    with ThreadPoolExecutor(8) as ex:
        list(ex.map(lambda n: call("DELETE", f"{base}/o/{quote(n, safe='')}"), names))
    call("DELETE", base)


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
) -> tuple[float, float, float, float, float | None] | str:
    """Run one upload tool as a child in its own session and measure it: (wall s, CPU s of
    the child and its reaped children from ``wait4``, CPU s of the server ``server_pid`` over
    the run, peak RSS MiB of the child's process tree, sampled: ``ru_maxrss`` would include
    the parent's, inherited at fork; the child's CPU s before its first byte, from the
    ``setup_cpu`` line ``setup_done()`` prints, or None when it printed none). The child's
    stdout goes to a temp file, not a pipe, so a chatty tool cannot block on it. On a
    non-zero exit or after ``timeout`` seconds (the session is killed) the stderr tail is
    returned instead, as text."""
    srv = psutil.Process(server_pid)
    before = sum(srv.cpu_times()[:2])
    with tempfile.TemporaryFile() as out_file, tempfile.TemporaryFile() as err_file:
        start = time.perf_counter()
        proc = subprocess.Popen(
            cmd,
            stdout=out_file,
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
        out_file.seek(0)
        out = out_file.read().decode(errors="replace")
    if status != 0:
        why = "timed out" if seconds >= timeout else f"exit {proc.returncode}"
        return f"{why}: {' | '.join(err[-600:].splitlines())}"
    after = sum(srv.cpu_times()[:2])
    cpu = usage.ru_utime + usage.ru_stime
    return seconds, cpu, after - before, peak / MiB, parse_setup_cpu(out)


def start_up_columns(runs: Sequence[tuple[float, float | None, int]]) -> tuple[str, str]:
    """For one table row's runs of (child CPU s, its start-up CPU s or None, bytes): the
    median start-up CPU s and the median CPU s per GB (10^9 bytes) after it, to 2 decimals;
    "n/a" for both unless every run printed its start-up (``setup_done()``)."""
    known = [(cpu, setup, n) for cpu, setup, n in runs if setup is not None]
    if not runs or len(known) != len(runs):
        return "n/a", "n/a"
    setup = statistics.median(s for _, s, _ in known)
    after = statistics.median((cpu - s) / (n / 1e9) for cpu, s, n in known)
    return f"{setup:.2f}", f"{after:.2f}"


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
