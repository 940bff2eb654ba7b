"""Watching a trainer write: the daemon's CPU while a checkpoint file is written in place.

A trainer that writes a checkpoint file in place makes one ``write()`` call per piece
(``pickle`` frames are 64 KiB; other writers use 1 MiB or more). This measures what the
daemon spends while that happens, before the file is closed (so none of it is the upload):
a fresh daemon (``file://`` destination, inotify mode, default settings) watches a folder;
this process opens ``step_<n>.pt`` in it and writes ``--gib`` GiB of random bytes in pieces
of each ``--pieces`` size, then waits ``--drain`` seconds for the daemon to read the last
events, and reads the daemon's CPU time (user + system, psutil) before and after. The file
is then closed and its commit awaited, so the next case starts quiet. An idle window of the
same daemon (nothing written, ``--idle`` seconds) gives its CPU rate at rest, which is
subtracted: "event handling" is what the writes cost.

    .venv/bin/python -m bench.watch_events --runs 3
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import psutil

from bench._common import Report, md_table, new_target, start_daemon, stop_daemon, tree_cpu
from tests.e2e.harness import checkpoint_is

KiB = 1024
GiB = 1024**3


def piece_sizes(text: str) -> list[int]:
    """``--pieces``: sizes in KiB, comma-separated."""
    return [int(x) * KiB for x in text.split(",") if x.strip()]


def write_in_pieces(path: Path, total: int, piece: bytes) -> int:
    """Write ``total`` bytes to ``path`` in ``len(piece)`` calls; the file stays open. The fd."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    for _ in range(total // len(piece)):
        os.write(fd, piece)
    return fd


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--gib", type=float, default=1.0, help="bytes written per case, GiB")
    p.add_argument("--pieces", type=piece_sizes, default=piece_sizes("64,1024,8192"))
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--idle", type=float, default=5.0, help="idle window, seconds")
    p.add_argument("--drain", type=float, default=0.5, help="wait after the last write")
    p.add_argument("--quiet", type=float, default=3.0, help="wait after the daemon is ready")
    a = p.parse_args()
    report = Report("watch_events")
    work = Path(tempfile.mkdtemp(prefix="bench-watch-events-", dir="/tmp"))
    total = int(a.gib * GiB)
    try:
        watch = work / "watch"
        watch.mkdir()
        t = new_target("file", work, None, "remote")
        d = start_daemon(watch, t, {"CKPT_SIDECAR_WATCH__SETTLE_SECONDS": "1.0"})
        try:
            d.wait_for("daemon.ready", timeout=60)
            time.sleep(a.quiet)  # start-up work (state cache, first scan) ends
            proc = psutil.Process(d.proc.pid)
            c0, t0 = tree_cpu(proc), time.monotonic()
            time.sleep(a.idle)
            idle_rate = (tree_cpu(proc) - c0) / (time.monotonic() - t0)
            step = 0
            for run in range(1, a.runs + 1):
                for size in a.pieces:
                    step += 1
                    piece = os.urandom(size)
                    name = f"step_{step}.pt"
                    c0, t0 = tree_cpu(proc), time.monotonic()
                    fd = write_in_pieces(watch / name, total, piece)
                    time.sleep(a.drain)  # the daemon reads the last events
                    cpu, secs = tree_cpu(proc) - c0, time.monotonic() - t0
                    os.close(fd)
                    d.wait_for("checkpoint.committed", timeout=300, where=checkpoint_is(name))
                    (watch / name).unlink()
                    events = cpu - idle_rate * secs
                    row = {
                        "run": run,
                        "piece_kib": size // KiB,
                        "writes": total // size,
                        "gib": round(total / GiB, 2),
                        "window_s": round(secs, 2),
                        "daemon_cpu_s": round(cpu, 3),
                        "idle_cpu_per_s": round(idle_rate, 4),
                        "event_cpu_s": round(events, 3),
                        "event_cpu_s_per_gib": round(events / (total / GiB), 3),
                    }
                    report.rows.append(row)
                    print(row, flush=True)
        finally:
            stop_daemon(d)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    report.finish(table(report.rows))


def table(rows: list[dict[str, Any]]) -> str:
    out = []
    for kib in sorted({r["piece_kib"] for r in rows}):
        rs = [r for r in rows if r["piece_kib"] == kib]
        per = [r["event_cpu_s_per_gib"] for r in rs]
        out.append(
            [
                f"{kib:,} KiB",
                f"{rs[0]['writes']:,}",
                rs[0]["gib"],
                statistics.median(r["window_s"] for r in rs),
                statistics.median(r["daemon_cpu_s"] for r in rs),
                f"**{statistics.median(per):.3f}**",
                f"{min(per):.3f}-{max(per):.3f}",
                len(rs),
            ]
        )
    return md_table(
        [
            "piece",
            "write() calls",
            "GiB",
            "window s",
            "daemon CPU s",
            "event handling CPU-s/GiB (median)",
            "range",
            "runs",
        ],
        out,
    )


if __name__ == "__main__":
    main()
