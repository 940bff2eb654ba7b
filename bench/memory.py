"""Peak RSS of the daemon, default settings, while it uploads a 10 GiB checkpoint.

Checkpoints (``--shapes``): ``one``: a 10 GiB file ``step_1.pt``; ``four``: a folder
``step_2`` of 4 files of 2.5 GiB; ``mixed``: a folder ``step_3`` of files of 1-64 MiB (whole
MiB, sizes from a fixed seed, the last one cut to make the total). Each is written beforehand
outside the watch folder (deterministic bytes, temp name then rename) and renamed in once the
daemon is ready. Destinations (``--backends``): ``file://`` (a folder on
the same disk), S3 on a local SeaweedFS, Azure Blob on a local Azurite persisting to disk, and
GCS on a local emulator. A fresh server per run. RSS of the daemon and its children is sampled
with psutil every 50 ms from ``daemon.ready`` to ``checkpoint.committed``; the server's RSS
too. Every setting is the default (``watch.settle_seconds`` 1.0, ``upload.concurrency`` 4,
the backends' own part/block/chunk defaults) except what the test harness always sets: JSON
logs, admin port 0 (a free port), no preemption source. The data and the uploaded copies are
deleted afterwards.

GCS is measured at ``--gcs-gib`` (2 by default): neither local emulator can take a 10 GiB
object on a 24 GiB machine. Both hold an object being uploaded in memory, whole:
gcp-storage-emulator (the default here) re-reads and re-writes the partial object on every
request (about 2 x the object at its peak); fake-gcs-server appends each request's body and
hashes the whole content again (6.6 GiB peak RSS for a 1 GiB upload). The ``mixed`` shape
(objects of at most 64 MiB) fits at 10 GiB on fake-gcs-server, which keeps finished objects
on disk (under 1 GiB of server RSS); gcp-storage-emulator here keeps them in memory.
``--gcs-emulator look-alike`` takes 10 GiB (``--gcs-gib 10``): the tests' GCS look-alike,
keeping no bytes, with the daemon uploading as on real GCS (XML multipart from 1 GiB;
bench/_common.py ``GCS_LOOK_ALIKE``).

    .venv/bin/python -m bench.memory --backends s3,file --shapes one,four
    .venv/bin/python -m bench.memory --backends gcs,azure --shapes one,four
    .venv/bin/python -m bench.memory --backends gcs --shapes mixed --gcs-gib 10 \
        --gcs-emulator fake-gcs-server
    .venv/bin/python -m bench.memory --backends gcs --shapes one,four --gcs-gib 10 \
        --gcs-emulator look-alike
"""

from __future__ import annotations

import argparse
import os
import random
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

import psutil

from bench._common import (
    GCS_EMULATORS,
    GCS_LOOK_ALIKE,
    GiB,
    MiB,
    Report,
    RssSampler,
    Store,
    drop_target,
    md_table,
    new_target,
    start_daemon,
    stop_daemon,
    store,
    store_label,
    store_pid,
    tree_bytes,
    tree_cpu,
    ts,
    write_file,
)
from tests.e2e.harness import checkpoint_is

TARGET_MB = 150
DEFAULT_SETTLE = 1.0


def mixed_sizes(total: int) -> list[int]:
    """Sizes of 1-64 MiB from a fixed seed adding up to ``total``: the ``mixed`` shape."""
    rng = random.Random(3)
    sizes: list[int] = []
    left = total
    while left > 0:
        sizes.append(min(left, rng.randint(1, 64) * MiB))
        left -= sizes[-1]
    return sizes


def make(shape: str, stage: Path, total: int) -> Path:
    if shape == "one":
        p = stage / "step_1.pt"
        write_file(p, total, seed=7)
        return p
    if shape == "mixed":
        folder = stage / "step_3"
        folder.mkdir()
        for i, size in enumerate(mixed_sizes(total)):
            write_file(folder / f"shard_{i:03d}.bin", size, seed=300 + i)
        return folder
    folder = stage / "step_2"
    folder.mkdir()
    for i in range(4):
        write_file(folder / f"shard_{i}.bin", total // 4, seed=70 + i)
    return folder


def label(shape: str, total: int) -> str:
    if shape == "one":
        return f"1 x {total / GiB:g} GiB file"
    if shape == "mixed":
        return f"{len(mixed_sizes(total))} files of 1-64 MiB, {total / GiB:g} GiB"
    return f"4 x {total / 4 / GiB:g} GiB folder"


def minor_faults(pid: int) -> int:
    """Minor page faults of process ``pid`` so far (``/proc/PID/stat``, field 10)."""
    stat = Path(f"/proc/{pid}/stat").read_text(encoding="ascii")
    return int(stat.rpartition(")")[2].split()[7])


def one_run(
    src: Path, work: Path, kind: str, server: Store, extra: dict[str, str]
) -> dict[str, Any]:
    t = new_target(kind, work, server, "mem")
    pid = store_pid(server)
    server_rss = RssSampler(pid) if pid is not None else None
    watch = Path(tempfile.mkdtemp(prefix="watch-", dir=work))
    env = {"CKPT_SIDECAR_WATCH__SETTLE_SECONDS": str(DEFAULT_SETTLE), **extra}
    d = start_daemon(watch, t, env)
    try:
        d.wait_for("daemon.ready", timeout=60)
        proc = psutil.Process(d.proc.pid)
        rss_ready = proc.memory_info().rss
        sampler = RssSampler(d.proc.pid)
        cpu0 = tree_cpu(proc)
        faults0 = minor_faults(d.proc.pid)
        os.rename(src, watch / src.name)
        t_done = time.time()
        try:
            ev = d.wait_for("checkpoint.committed", timeout=3600, where=checkpoint_is(src.name))
            cpu = tree_cpu(proc) - cpu0
            faults = minor_faults(d.proc.pid) - faults0
        finally:
            peak = sampler.stop()
            server_peak = server_rss.stop() if server_rss is not None else 0
            os.rename(watch / src.name, src)
        # a folder is complete after settle_seconds of quiet; a file renamed in at once
        seconds = ts(ev) - t_done - (DEFAULT_SETTLE if src.is_dir() else 0.0)
        size = tree_bytes(src)
        return {
            "rss_ready_mb": round(rss_ready / 1e6, 1),
            "peak_rss_mb": round(peak / 1e6, 1),
            "samples": sampler.samples,
            "upload_s": round(seconds, 1),
            "mb_per_s": round(size / 1e6 / seconds, 1),
            "cpu_s_per_gb": round(cpu / (size / 1e9), 2),
            "minor_faults_per_gb": round(faults / (size / 1e9)),
            "server_peak_rss_mb": round(server_peak / 1e6, 1) if server_rss else None,
        }
    finally:
        if server_rss is not None:
            server_rss.stop()
        stop_daemon(d)
        drop_target(t, server)
        shutil.rmtree(watch, ignore_errors=True)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--backends", default="s3,file", help="of file, s3, gcs, azure")
    p.add_argument("--shapes", default="one,four", help="of one, four, mixed")
    p.add_argument("--gib", type=float, default=10.0)
    p.add_argument(
        "--gcs-gib",
        type=float,
        default=2.0,
        help="checkpoint size for gcs: the emulators hold an upload in memory, whole "
        "(the mixed shape fits at 10 on fake-gcs-server)",
    )
    p.add_argument(
        "--gcs-emulator",
        choices=(*GCS_EMULATORS, GCS_LOOK_ALIKE),
        default="gcp-storage-emulator",
        help=f"{GCS_LOOK_ALIKE}: the tests' look-alike keeping no bytes, uploads as on real "
        "GCS (XML multipart from 1 GiB); use it with --gcs-gib 10",
    )
    p.add_argument(
        "--daemon-env",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="set in the daemon's environment, e.g. "
        "CKPT_SIDECAR_DESTINATION__S3__PART_CONCURRENCY=6 (the harness drops CKPT_SIDECAR_* "
        "inherited from this shell)",
    )
    a = p.parse_args()
    extra = dict(kv.split("=", 1) for kv in a.daemon_env)
    backends = a.backends.split(",")

    def total(kind: str) -> int:
        gib = a.gcs_gib if kind == "gcs" else a.gib
        return int(gib * GiB) // (4 * MiB) * (4 * MiB)

    report = Report("memory")
    work = Path(tempfile.mkdtemp(prefix="bench-memory-", dir="/tmp"))
    try:
        for shape in a.shapes.split(","):
            for size in dict.fromkeys(total(k) for k in backends):
                stage = work / "stage"
                stage.mkdir()
                t0 = time.monotonic()
                src = make(shape, stage, size)
                print(f"wrote {label(shape, size)}: {time.monotonic() - t0:.0f} s", flush=True)
                for kind in (k for k in backends if total(k) == size):
                    with store(kind, a.gcs_emulator) as server:
                        r = one_run(src, work, kind, server, extra)
                        where = store_label(kind, server)
                    row = {
                        "destination": kind,
                        "store": where,
                        "checkpoint": label(shape, size),
                        "bytes": tree_bytes(src),
                        **r,
                    }
                    report.rows.append(row)
                    print(row, flush=True)
                shutil.rmtree(stage)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    report.finish(table(report.rows), merge_on=("destination", "checkpoint"))


def table(rows: list[dict[str, Any]]) -> str:
    out = [
        [
            r.get("store") or ("S3 (SeaweedFS)" if r["destination"] == "s3" else "file://"),
            r["checkpoint"],
            r["rss_ready_mb"],
            f"**{r['peak_rss_mb']}**",
            r["upload_s"],
            r["mb_per_s"],
            r["cpu_s_per_gb"],
            "" if r.get("minor_faults_per_gb") is None else f"{r['minor_faults_per_gb']:,}",
            "" if r.get("server_peak_rss_mb") is None else r["server_peak_rss_mb"],
            f"<= {TARGET_MB}: " + ("met" if r["peak_rss_mb"] <= TARGET_MB else "**not met**"),
        ]
        for r in rows
    ]
    return md_table(
        [
            "destination",
            "checkpoint",
            "RSS at ready MB",
            "peak RSS MB",
            "upload s",
            "MB/s",
            "CPU-s/GB",
            "minor faults/GB",
            "server peak RSS MB",
            "target",
        ],
        out,
        right=2,
    )


if __name__ == "__main__":
    main()
