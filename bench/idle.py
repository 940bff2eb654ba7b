"""Idle cost: CPU the daemon uses in 60 s of watching 10,000 committed files, nothing changing.

Set-up: a watch folder of 10,000 files of 4 KiB -- as 100 checkpoints of 100 files and as one
checkpoint of 10,000 files -- committed to a ``file://`` destination by a first daemon run.
Then, per watch mode (``CKPT_SIDECAR_WATCH__MODE`` = ``inotify`` / ``poll``, default poll
interval 1.0 s, default settle 1.0 s), a fresh daemon with the warm state cache starts, every
checkpoint is recognised as committed (convergence), ``--quiet`` seconds pass, and then the
daemon's CPU time (user + system, children included, psutil) is read before and after
``--seconds`` of nothing changing. The figure is % of one core.

    .venv/bin/python -m bench.idle --seconds 60 --modes inotify,poll
"""

from __future__ import annotations

import argparse
import shutil
import tempfile
import time
from pathlib import Path

import psutil

from bench._common import (
    Report,
    build_committed,
    converged,
    md_table,
    new_target,
    start_daemon,
    stop_daemon,
    tree_cpu,
    wait_until,
)

SHAPES = {"100 x 100 files": (100, 100), "1 x 10,000 files": (1, 10_000)}
TARGET_PCT = 1.0


def verdict(mode: str, pct: float) -> str:
    if mode != "inotify":
        return "(none)"
    return f"< {TARGET_PCT}%: " + ("met" if pct < TARGET_PCT else "**not met**")


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--seconds", type=float, default=60.0)
    p.add_argument("--quiet", type=float, default=5.0, help="wait after convergence")
    p.add_argument("--modes", default="inotify,poll")
    a = p.parse_args()
    report = Report("idle")
    work = Path(tempfile.mkdtemp(prefix="bench-idle-", dir="/tmp"))
    try:
        for shape, (n, each) in SHAPES.items():
            t = new_target("file", work, None, "remote")
            watch = work / f"watch-{n}"
            names = build_committed(watch, t, n, each)
            for mode in a.modes.split(","):
                d = start_daemon(
                    watch,
                    t,
                    {
                        "CKPT_SIDECAR_WATCH__MODE": mode,
                        "CKPT_SIDECAR_WATCH__SETTLE_SECONDS": "1.0",
                    },
                )
                try:
                    d.wait_for("daemon.ready", timeout=60)
                    wait_until(d, converged(names), timeout=300)
                    time.sleep(a.quiet)
                    proc = psutil.Process(d.proc.pid)
                    n_events = len(d.events)
                    cpu0, t0 = tree_cpu(proc), time.monotonic()
                    time.sleep(a.seconds)
                    cpu, secs = tree_cpu(proc) - cpu0, time.monotonic() - t0
                    new = [e.get("event") for e in d.events[n_events:]]
                    uploads = len(d.named("checkpoint.committed"))
                finally:
                    stop_daemon(d)
                row = {
                    "files": "10,000",
                    "checkpoints": shape,
                    "mode": mode,
                    "seconds": round(secs, 1),
                    "cpu_s": round(cpu, 3),
                    "pct_of_one_core": round(100 * cpu / secs, 2),
                    "log_events_while_measured": len(new),
                    "uploads": uploads,
                }
                report.rows.append(row)
                print(row, flush=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    rows = [
        [
            r["checkpoints"],
            r["mode"],
            r["seconds"],
            r["cpu_s"],
            f"**{r['pct_of_one_core']}**",
            r["log_events_while_measured"],
            verdict(r["mode"], r["pct_of_one_core"]),
        ]
        for r in report.rows
    ]
    report.finish(
        md_table(
            [
                "10,000 committed files as",
                "mode",
                "window s",
                "CPU s",
                "% of one core",
                "log lines in window",
                "target",
            ],
            rows,
            right=2,
        )
    )


if __name__ == "__main__":
    main()
