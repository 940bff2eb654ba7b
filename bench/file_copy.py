"""``file://`` backend vs ``cp`` and ``rsync`` on the same disk: throughput and CPU-s/GB.

Data (deterministic, written once into a temp folder under /tmp, the same disk as the
destination): one 2 GiB file and a folder of 100 files of 1-64 MiB (seed 11). Each run
copies into an empty destination folder on the same disk; between runs the destination is
deleted and the file system synced (``sync -f``). Source pages stay in the page cache for
every tool (they cannot be dropped in this container); what differs is durability:

* ``cp`` / ``rsync -a --whole-file``: done when the data is in the page cache; the
  ``+ sync`` rows add the time of ``sync -f`` on the destination right after (durable);
* ``rsync --fsync``: fsyncs each file (durable);
* ``ours put_file``: ``LocalBackend.put_file`` in this process, 4 files at a time like the
  daemon (1 for the single file): temp name, the bytes copied in the kernel (``sendfile``)
  in 256 KiB pieces, each read back for the CRC32C, fsync file, rename, fsync folder
  (durable); CPU = this process's user + system time over the copy;
* ``ours daemon``: the whole daemon, end to end: the checkpoint is renamed into the watch
  folder, time to ``checkpoint.committed`` (includes ``watch.settle_seconds`` = ``--settle``
  for the folder; a single file renamed into place is complete at once); CPU = the
  daemon's user + system time over that interval.

The order of the tools is shuffled from run to run (fixed seeds), after one untimed warm-up
copy: on this VM the kernel time of writing 2 GiB into the page cache varies about 5x with
what ran just before, so no tool may always follow the same one.
Child tools' CPU is their rusage (``wait4``, children included). MB = 10^6 bytes,
GB = 10^9 bytes.

    .venv/bin/python -m bench.file_copy --runs 3
"""

from __future__ import annotations

import argparse
import os
import random
import shutil
import statistics
import subprocess
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import psutil

from bench._common import (
    GiB,
    Report,
    Target,
    md_table,
    spread_sizes,
    start_daemon,
    stop_daemon,
    tree_bytes,
    tree_files,
    ts,
    write_file,
    write_folder,
)
from sidecar.storage.local import LocalBackend
from tests.e2e.harness import checkpoint_is

TOOLS = ("cp", "rsync", "rsync --fsync", "ours put_file", "ours daemon")
TARGET_CPU = 1.0


def sync_fs(path: Path) -> float:
    start = time.perf_counter()
    subprocess.run(["sync", "-f", str(path)], check=True)
    return time.perf_counter() - start


def child(cmd: list[str]) -> tuple[float, float, float]:
    """(wall seconds, user CPU s, system CPU s; children included) of one command."""
    start = time.perf_counter()
    proc = subprocess.Popen(cmd)
    _, status, ru = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - start
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode != 0:
        raise RuntimeError(f"{cmd} exited {proc.returncode}")
    return wall, ru.ru_utime, ru.ru_stime


def ours_put_file(src: Path, dst: Path) -> tuple[float, float, float]:
    backend = LocalBackend(dst)
    files = tree_files(src)
    base = src.parent
    me = psutil.Process()
    c0 = me.cpu_times()
    start = time.perf_counter()
    with ThreadPoolExecutor(4 if src.is_dir() else 1) as ex:
        list(ex.map(lambda p: backend.put_file(p.relative_to(base).as_posix(), p), files))
    wall, c1 = time.perf_counter() - start, me.cpu_times()
    return wall, c1.user - c0.user, c1.system - c0.system


def ours_daemon(src: Path, dst: Path, work: Path, settle: float) -> tuple[float, float, float]:
    watch = Path(tempfile.mkdtemp(prefix="watch-", dir=work))
    d = start_daemon(
        watch, Target(f"file://{dst}", {}, dst), {"CKPT_SIDECAR_WATCH__SETTLE_SECONDS": str(settle)}
    )
    try:
        d.wait_for("daemon.ready", timeout=60)
        proc = psutil.Process(d.proc.pid)
        c0 = proc.cpu_times()
        os.rename(src, watch / src.name)
        t_done = time.time()
        try:
            ev = d.wait_for("checkpoint.committed", timeout=900, where=checkpoint_is(src.name))
            c1 = proc.cpu_times()
        finally:
            os.rename(watch / src.name, src)
        return ts(ev) - t_done, c1.user - c0.user, c1.system - c0.system
    finally:
        stop_daemon(d)
        shutil.rmtree(watch, ignore_errors=True)


def one(tool: str, src: Path, dst: Path, work: Path, settle: float) -> dict[str, float]:
    dst.mkdir()
    extra = 0.0
    if tool == "cp":
        wall, user, system = child(["cp", "-r", str(src), str(dst) + "/"])
        extra = sync_fs(dst)
    elif tool == "rsync":
        wall, user, system = child(["rsync", "-a", "--whole-file", str(src), str(dst) + "/"])
        extra = sync_fs(dst)
    elif tool == "rsync --fsync":
        wall, user, system = child(
            ["rsync", "-a", "--whole-file", "--fsync", str(src), str(dst) + "/"]
        )
    elif tool == "ours put_file":
        wall, user, system = ours_put_file(src, dst)
    else:
        wall, user, system = ours_daemon(src, dst, work, settle)
    return {
        "wall_s": wall,
        "cpu_s": user + system,
        "user_s": user,
        "system_s": system,
        "sync_s": extra,
    }


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--tools", default=",".join(TOOLS))
    p.add_argument("--file-gib", type=float, default=2.0)
    p.add_argument("--settle", type=float, default=0.2)
    a = p.parse_args()
    tools = [t for t in a.tools.split(",") if t]
    report = Report("file_copy")
    work = Path(tempfile.mkdtemp(prefix="bench-copy-", dir="/tmp"))
    try:
        (work / "src").mkdir()
        data = {
            f"1 x {a.file_gib:g} GiB": work / "src" / "big.pt",
            "100 x 1-64 MiB": work / "src" / "step_100",
        }
        write_file(data[f"1 x {a.file_gib:g} GiB"], int(a.file_gib * GiB), seed=5)
        write_folder(data["100 x 1-64 MiB"], spread_sizes(100, 1, 64, seed=11), seed=11)
        for name, src in data.items():
            size = tree_bytes(src)
            warm = work / "dst"  # one untimed copy first: the disk settles into its steady state
            warm.mkdir()
            ours_put_file(src, warm)
            shutil.rmtree(warm)
            for run in range(a.runs):
                order = list(tools)
                random.Random(run).shuffle(order)  # no tool always follows the same one
                for tool in order:
                    dst = work / "dst"
                    sync_fs(work)
                    r = one(tool, src, dst, work, a.settle)
                    shutil.rmtree(dst)
                    row: dict[str, Any] = {
                        "data": name,
                        "bytes": size,
                        "tool": tool,
                        "run": run + 1,
                        **{k: round(v, 3) for k, v in r.items()},
                    }
                    report.rows.append(row)
                    print(row, flush=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    report.finish(table(report.rows, tools), {"settle_s": a.settle})


def table(rows: list[dict[str, Any]], tools: list[str]) -> str:
    out = []
    for name in dict.fromkeys(r["data"] for r in rows):
        for tool in tools:
            rs = [r for r in rows if r["data"] == name and r["tool"] == tool]
            size = rs[0]["bytes"]
            cpu = statistics.median(r["cpu_s"] for r in rs) / (size / 1e9)
            mbps = statistics.median(size / 1e6 / r["wall_s"] for r in rs)
            lo = min(size / 1e6 / r["wall_s"] for r in rs)
            hi = max(size / 1e6 / r["wall_s"] for r in rs)
            cpus = [r["cpu_s"] / (size / 1e9) for r in rs]
            user = statistics.median(r["user_s"] for r in rs) / (size / 1e9)
            label = tool
            durable = "yes" if tool not in ("cp", "rsync") else "no"
            out.append(
                [
                    name,
                    label,
                    durable,
                    f"{mbps:.0f}",
                    f"{lo:.0f}-{hi:.0f}",
                    f"{cpu:.2f}",
                    f"{min(cpus):.2f}-{max(cpus):.2f}",
                    f"{user:.2f}",
                ]
            )
            if tool in ("cp", "rsync"):
                synced = statistics.median(size / 1e6 / (r["wall_s"] + r["sync_s"]) for r in rs)
                row = [name, f"{tool} + sync", "yes", f"{synced:.0f}", "", f"{cpu:.2f}", "", ""]
                out.append(row)
    return md_table(
        [
            "data",
            "tool",
            "durable when done",
            "MB/s (median)",
            "MB/s range",
            "CPU-s/GB (median)",
            "CPU-s/GB range",
            "of it user (median)",
        ],
        out,
        right=3,
    )


if __name__ == "__main__":
    main()
