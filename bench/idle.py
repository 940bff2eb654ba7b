"""Idle cost: CPU the daemon uses in 60 s of watching 10,000 committed files, nothing changing.

Set-up, per destination (``--backends``: ``file://`` a folder on the same disk, S3 on a local
SeaweedFS, GCS on a local emulator -- ``--gcs-emulator``, fake-gcs-server on disk by default --
and Azure Blob on a local Azurite persisting to disk; one server per destination kind): a
watch folder of 10,000 files of 4 KiB -- as 100 checkpoints of 100 files and as one
checkpoint of 10,000 files -- committed to a fresh destination by a first daemon run. Then,
per watch mode (``CKPT_SIDECAR_WATCH__MODE`` = ``inotify`` / ``poll``, default poll interval
1.0 s, default settle 1.0 s), a fresh daemon with the warm state cache starts, every
checkpoint is recognised as committed (convergence), ``--quiet`` seconds pass, and then the
daemon's CPU time (user + system, children included, psutil) is read before and after
``--seconds`` of nothing changing. The figure is % of one core. Its wake-ups (voluntary
context switches of all its threads, from ``/proc``) are counted over the same window: at
rest they are most of what it costs (on this VM a thread woken from a timed wait costs
2-5 ms of CPU). The store server is a separate
process (a child of this one, not of the daemon): its CPU over the same window is recorded
in the JSON (``store_cpu_s``) but is not part of the daemon's figure.

    .venv/bin/python -m bench.idle --seconds 60 --modes inotify,poll
    .venv/bin/python -m bench.idle --seconds 60 --modes inotify,poll --backends gcs,azure
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

import psutil

from bench._common import (
    GCS_EMULATORS,
    KINDS,
    Report,
    Store,
    Target,
    build_committed,
    converged,
    drop_target,
    md_table,
    new_target,
    start_daemon,
    stop_daemon,
    store,
    store_label,
    store_pid,
    tree_cpu,
    wait_until,
)

SHAPES = {"100 x 100 files": (100, 100), "1 x 10,000 files": (1, 10_000)}
TARGET_PCT = 1.0


def verdict(mode: str, pct: float) -> str:
    if mode != "inotify":
        return "(none)"
    return f"< {TARGET_PCT}%: " + ("met" if pct < TARGET_PCT else "**not met**")


def wakeups(pid: int) -> int:
    """Voluntary context switches of every thread of ``pid`` so far (0 for a thread gone)."""
    total = 0
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            status = Path(f"/proc/{pid}/task/{tid}/status").read_text()
        except OSError:
            continue
        m = re.search(r"^voluntary_ctxt_switches:\s+(\d+)", status, re.M)
        total += int(m.group(1)) if m else 0
    return total


def kinds(text: str) -> list[str]:
    """``--backends``: a comma-separated list of destination kinds (file, s3, gcs, azure)."""
    out = [k.strip() for k in text.split(",") if k.strip()]
    bad = [k for k in out if k not in KINDS]
    if bad or not out:
        raise argparse.ArgumentTypeError(f"{text!r}: a comma-separated list of {', '.join(KINDS)}")
    return out


def measure(
    watch: Path, t: Target, names: set[str], mode: str, server: Store, seconds: float, quiet: float
) -> dict[str, Any]:
    """One idle window of a fresh daemon on ``watch`` -> ``t`` in watch mode ``mode``."""
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
        time.sleep(quiet)
        proc = psutil.Process(d.proc.pid)  # the daemon (and its children) only
        pid = store_pid(server)
        srv = psutil.Process(pid) if pid is not None else None
        n_events = len(d.events)
        srv0 = tree_cpu(srv) if srv is not None else 0.0
        wake0 = wakeups(proc.pid)
        cpu0, t0 = tree_cpu(proc), time.monotonic()
        time.sleep(seconds)
        cpu, secs = tree_cpu(proc) - cpu0, time.monotonic() - t0
        woke = wakeups(proc.pid) - wake0
        srv_cpu = tree_cpu(srv) - srv0 if srv is not None else None
        new = [e.get("event") for e in d.events[n_events:]]
        uploads = len(d.named("checkpoint.committed"))
    finally:
        stop_daemon(d)
    return {
        "seconds": round(secs, 1),
        "cpu_s": round(cpu, 3),
        "pct_of_one_core": round(100 * cpu / secs, 2),
        "wakeups_per_s": round(woke / secs, 2),
        "log_events_while_measured": len(new),
        "uploads": uploads,
        "store_cpu_s": round(srv_cpu, 3) if srv_cpu is not None else None,
    }


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--seconds", type=float, default=60.0)
    p.add_argument("--quiet", type=float, default=5.0, help="wait after convergence")
    p.add_argument("--modes", default="inotify,poll")
    p.add_argument(
        "--backends", type=kinds, default=["file"], help="comma-separated: file, s3, gcs, azure"
    )
    p.add_argument("--gcs-emulator", choices=GCS_EMULATORS, default="fake-gcs-server")
    a = p.parse_args()
    modes = [m.strip() for m in a.modes.split(",") if m.strip()]
    report = Report("idle")
    work = Path(tempfile.mkdtemp(prefix="bench-idle-", dir="/tmp"))
    try:
        for backend in a.backends:
            with store(backend, a.gcs_emulator) as server:
                where = store_label(backend, server)
                for shape, (n, each) in SHAPES.items():
                    t = new_target(backend, work, server, "remote")
                    watch = work / f"watch-{backend}-{n}"
                    try:
                        names = build_committed(watch, t, n, each)
                        for mode in modes:
                            r = measure(watch, t, names, mode, server, a.seconds, a.quiet)
                            row = {
                                "destination": backend,
                                "store": where,
                                "files": "10,000",
                                "checkpoints": shape,
                                "mode": mode,
                                **r,
                            }
                            report.rows.append(row)
                            print(row, flush=True)
                    finally:
                        drop_target(t, server)
                        shutil.rmtree(watch, ignore_errors=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    report.finish(table(report.rows), merge_on=("destination", "checkpoints", "mode"))


def table(rows: list[dict[str, Any]]) -> str:
    return md_table(
        [
            "destination",
            "10,000 committed files as",
            "mode",
            "window s",
            "CPU s",
            "% of one core",
            "wake-ups/s",
            "log lines in window",
            "target",
        ],
        [
            [
                r.get("store") or KINDS[r["destination"]],
                r["checkpoints"],
                r["mode"],
                r["seconds"],
                r["cpu_s"],
                f"**{r['pct_of_one_core']}**",
                r.get("wakeups_per_s", "n/a"),
                r["log_events_while_measured"],
                verdict(r["mode"], r["pct_of_one_core"]),
            ]
            for r in rows
        ],
        right=3,
    )


if __name__ == "__main__":
    main()
