"""Commit latency: time from a checkpoint folder being complete to its manifest, minus transfer.

Two checkpoint folders (default layout ``plain``): 100 files of 1-64 MiB (sizes from seed 11)
and 10,000 files of 4 KiB, against ``file://`` (a folder on the same disk), S3 on a local
SeaweedFS, GCS on a local emulator (fake-gcs-server with ``-backend filesystem`` by default:
gcp-storage-emulator rewrites its whole metadata file on every object written, which grows
with the square of 10,000 files) and Azure Blob on a local Azurite persisting to disk; one
server for the whole run of a backend. For each run:

1. the daemon starts on an empty watch folder and a fresh destination and logs ``daemon.ready``;
2. the finished folder is renamed into the watch folder as ``step_1`` (what a careful trainer
   does; every file was closed before) -- ``t_done`` is taken right after the rename;
3. ``checkpoint.committed`` is logged right after the manifest's create-only write returned;
4. pure transfer: the same files go to a fresh destination through the same backend class's
   ``put_file`` (``open_backend`` on the same URL and options, so the same client library,
   chunk/part/block sizes and checksums as the daemon) in this process, 4 at a time (the
   daemon's ``upload.concurrency``), timed; twice, right before and right after the daemon's
   commit, and the mean taken, so that a single slow or fast transfer moves the reference
   half as much (one transfer of 3 GB to SeaweedFS varied by 1.4 s between runs while the
   daemon's commits varied by 0.6 s, bench/commit_latency.md).

overhead = (committed - t_done) - settle_seconds - pure transfer of the same run. A plain folder
is complete when nothing changed for ``watch.settle_seconds`` (set to ``--settle``, default
0.5 s, by env var); that wait is by design and subtracted. The daemon's CPU seconds over the
commit are reported too. Every run uses a fresh destination so no file is copied server-side.

    .venv/bin/python -m bench.commit_latency --runs 3 --backends file,s3
    .venv/bin/python -m bench.commit_latency --runs 3 --backends gcs,azure
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import psutil

from bench._common import (
    GCS_EMULATORS,
    KINDS,
    KiB,
    MiB,
    Report,
    Store,
    Target,
    drop_target,
    md_table,
    new_target,
    spread_sizes,
    start_daemon,
    stop_daemon,
    store,
    store_label,
    tree_bytes,
    tree_cpu,
    tree_files,
    ts,
    write_folder,
)
from tests.e2e.harness import checkpoint_is

SHAPES = {  # key: (label, file sizes, target overhead in seconds)
    "big": ("100 x 1-64 MiB", spread_sizes(100, 1, 64, seed=11), 0.5),
    "small": ("10,000 x 4 KiB", [4 * KiB] * 10_000, 5.0),
}
CONCURRENCY = 4


def daemon_run(src: Path, work: Path, t: Target, settle: float) -> dict[str, Any]:
    watch = Path(tempfile.mkdtemp(prefix="watch-", dir=work))
    d = start_daemon(watch, t, {"CKPT_SIDECAR_WATCH__SETTLE_SECONDS": str(settle)})
    try:
        d.wait_for("daemon.ready", timeout=60)
        proc = psutil.Process(d.proc.pid)
        cpu0 = tree_cpu(proc)
        os.rename(src, watch / "step_1")
        t_done = time.time()
        try:
            ev = d.wait_for("checkpoint.committed", timeout=1800, where=checkpoint_is("step_1"))
            cpu = tree_cpu(proc) - cpu0
            ready = d.wait_for("checkpoint.ready", where=checkpoint_is("step_1"))
        finally:
            os.rename(watch / "step_1", src)
        return {
            "to_manifest_s": ts(ev) - t_done,
            "detect_s": ts(ready) - t_done,
            "ready_to_manifest_s": float(ev["seconds"]),
            "daemon_cpu_s": cpu,
        }
    finally:
        stop_daemon(d)
        shutil.rmtree(watch, ignore_errors=True)


def fresh_transfer(src: Path, kind: str, work: Path, server: Store) -> tuple[float, float]:
    """:func:`transfer_run` into a fresh destination of ``kind``, dropped afterwards."""
    t = new_target(kind, work, server, "xfer")
    try:
        return transfer_run(src, t)
    finally:
        drop_target(t, server)


def transfer_run(src: Path, t: Target) -> tuple[float, float]:
    """(seconds, CPU seconds of this process) to put every file of ``src`` with the backend's
    put_file, 4 at a time."""
    backend = t.backend()
    files = tree_files(src)
    me = psutil.Process()  # this process only: the server is a child of it
    try:
        cpu0 = sum(me.cpu_times()[:2])
        start = time.perf_counter()
        with ThreadPoolExecutor(CONCURRENCY) as ex:
            list(
                ex.map(
                    lambda p: backend.put_file(f"step_1/{p.relative_to(src).as_posix()}", p),
                    files,
                )
            )
        return time.perf_counter() - start, sum(me.cpu_times()[:2]) - cpu0
    finally:
        backend.close()


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--backends", default="file,s3", help="of file, s3, gcs, azure")
    p.add_argument(
        "--shapes", default="big,small", help="big: 100 x 1-64 MiB; small: 10,000 x 4 KiB"
    )
    p.add_argument("--settle", type=float, default=0.5)
    p.add_argument("--gcs-emulator", choices=GCS_EMULATORS, default="fake-gcs-server")
    a = p.parse_args()
    shapes = [s.strip() for s in a.shapes.split(",") if s.strip()]
    backends = a.backends.split(",")
    report = Report("commit_latency")
    work = Path(tempfile.mkdtemp(prefix="bench-commit-", dir="/tmp"))
    try:
        stage = {}
        for i, name in enumerate(shapes):
            stage[name] = work / f"stage-{i}"
            write_folder(stage[name], SHAPES[name][1], seed=11 + i)
        for backend in backends:
            with store(backend, a.gcs_emulator) as server:
                where = store_label(backend, server)
                for name in shapes:
                    src = stage[name]
                    for run in range(a.runs):
                        before = fresh_transfer(src, backend, work, server)
                        t = new_target(backend, work, server, "lat")
                        try:
                            r = daemon_run(src, work, t, a.settle)
                        finally:
                            drop_target(t, server)
                        after = fresh_transfer(src, backend, work, server)
                        r["transfer_before_s"], r["transfer_after_s"] = before[0], after[0]
                        r["transfer_s"] = (before[0] + after[0]) / 2
                        r["transfer_cpu_s"] = (before[1] + after[1]) / 2
                        r["overhead_s"] = r["to_manifest_s"] - a.settle - r["transfer_s"]
                        row = {
                            "backend": backend,
                            "store": where,
                            "checkpoint": SHAPES[name][0],
                            "run": run + 1,
                            "bytes": tree_bytes(src),
                            "settle_s": a.settle,
                            **{k: round(v, 3) for k, v in r.items()},
                        }
                        report.rows.append(row)
                        print(row, flush=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    report.finish(table(report.rows, backends, shapes), merge_on=("backend", "checkpoint"))


def table(rows: list[dict[str, Any]], backends: list[str], shapes: list[str]) -> str:
    out = []
    for backend in backends:
        for name in shapes:
            label, _, target = SHAPES[name]
            rs = [r for r in rows if r["backend"] == backend and r["checkpoint"] == label]
            if not rs:
                continue

            def med(k: str, rs: list[dict[str, Any]] = rs) -> float:
                return float(statistics.median(r[k] for r in rs))

            over = med("overhead_s")
            out.append(
                [
                    rs[0].get("store") or KINDS[backend],
                    label,
                    f"{rs[0]['bytes'] / MiB:,.0f}",
                    f"{med('to_manifest_s'):.2f}",
                    f"{med('detect_s'):.2f}",
                    f"{med('transfer_s'):.2f}",
                    f"**{over:.2f}**",
                    " / ".join(f"{r['overhead_s']:.2f}" for r in rs),
                    f"{med('daemon_cpu_s'):.1f}",
                    f"{med('transfer_cpu_s'):.1f}",
                    f"<= {target}: {'met' if over <= target else '**not met**'}",
                ]
            )
    return md_table(
        [
            "destination",
            "checkpoint",
            "MiB",
            "done -> manifest s",
            "done -> ready s",
            "pure transfer s",
            "overhead s (median)",
            "overhead each run",
            "daemon CPU s",
            "put_file CPU s",
            "target",
        ],
        out,
        right=2,
    )


if __name__ == "__main__":
    main()
