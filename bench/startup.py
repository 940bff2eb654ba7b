"""Start-up: time from process start to ``daemon.ready`` and to the end of the convergence
scan, with 10,000 files already committed, and proof that no data object is downloaded.

Set-up per destination (``file://`` on the same disk, S3 on a local SeaweedFS, GCS on
fake-gcs-server persisting to disk, Azure Blob on Azurite persisting to disk): 10,000 files
of 4 KiB as 100 checkpoints x 100 files and as 1 checkpoint x 10,000 files, committed by a
first daemon run (queue and retention opened wide for that run only). Measured runs use the
default settings (settle 1.0 s, queue of 4: older checkpoints found at start are superseded
by newer committed ones, as in normal running). Convergence ends when every checkpoint was
logged ``checkpoint.already_committed`` or ``checkpoint.superseded``; a
``checkpoint.committed`` would mean something was uploaded again and is counted.

* warm: the state cache (``<watch>/.ckpt-sidecar-state``) from the set-up run;
* cold: ``CKPT_SIDECAR_STATE__DIR`` = a fresh empty folder, so every CRC32C the daemon needs
  is recomputed by reading local files (from the page cache: it cannot be dropped here).

Downloads: on S3, GCS and Azure one more run per row goes through a recording proxy and
every request is classified (data GET, manifest GET, list, other); that run is not timed
(the proxy adds about 45 ms per request). The proxies: tests/servers/seaweedfs.py
``S3Proxy`` for S3 and, pointed at by ``destination.azure.account_url``, for Azurite;
tests/servers/gcs.py ``gcs_proxy`` for GCS (``STORAGE_EMULATOR_HOST`` = the proxy). A data
GET is a read of an object's bytes (S3 and Azure: ``GET`` on a blob or key, no ``comp``;
GCS: ``alt=media``) outside ``.ckpt-sidecar/``. On ``file://`` an inotify watch on the
destination folder counts every open of a data file in every run.

    .venv/bin/python -m bench.startup --runs 3 --backends file,s3
    .venv/bin/python -m bench.startup --runs 3 --backends gcs,azure
"""

from __future__ import annotations

import argparse
import contextlib
import shutil
import statistics
import tempfile
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, unquote, urlsplit

from watchdog.events import FileOpenedEvent, FileSystemEvent, FileSystemEventHandler
from watchdog.observers.inotify import InotifyObserver

from bench._common import (
    KINDS,
    Report,
    Store,
    Target,
    build_committed,
    converged,
    md_table,
    new_target,
    start_daemon,
    stop_daemon,
    store,
    store_label,
    ts,
    wait_until,
)
from tests.e2e.harness import Event
from tests.servers.azurite import ACCOUNT, Azurite
from tests.servers.gcs import GcsServer, gcs_proxy
from tests.servers.seaweedfs import S3Proxy, S3Server

SHAPES = {"100 x 100 files": (100, 100), "1 x 10,000 files": (1, 10_000)}
TARGET_S = 10.0
RESERVED = ".ckpt-sidecar/"


class OpenCounter(FileSystemEventHandler):
    """Counts opens of files under a destination folder, data files apart from manifests."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.counts: Counter[str] = Counter()

    def on_any_event(self, event: FileSystemEvent) -> None:
        if isinstance(event, FileOpenedEvent):
            rel = Path(str(event.src_path)).relative_to(self.root).as_posix()
            self.counts["manifest/meta" if rel.startswith(RESERVED) else "data"] += 1


def classify(kind: str, requests: list[tuple[str, str]]) -> Counter[str]:
    """Count ``(method, path?query)`` requests by what they touched: a data object's bytes
    (``data GET``), a manifest or other file under ``.ckpt-sidecar/``, a listing, other."""
    out: Counter[str] = Counter()
    for method, target in requests:
        parts = urlsplit(target)
        query = parse_qs(parts.query, keep_blank_values=True)
        path = unquote(parts.path)
        if kind == "gcs":  # /storage/v1/b/<bucket>/o/<name>, or /download/storage/v1/...
            key = path.split("/o/", 1)[1] if "/o/" in path else ""
            reads = method == "GET" and query.get("alt") == ["media"]
        elif kind == "azure":  # /<account>/<container>/<blob>, path-style
            key = (path.lstrip("/").split("/", 2)[2:] or [""])[0]
            reads = method == "GET" and "comp" not in query
        else:  # S3, path-style: /<bucket>/<key>
            key = path.lstrip("/").partition("/")[2]
            reads = method == "GET"
        meta = RESERVED in key
        lists = method == "GET" and (
            kind == "s3" or query.get("comp") == ["list"] or path.endswith("/o")
        )
        if not key:
            out["list" if lists else f"{method} bucket"] += 1
        elif reads:
            out["manifest/meta GET" if meta else "data GET"] += 1
        else:
            out[f"{method} {'meta' if meta else 'data'}"] += 1
    return out


def measure(
    watch: Path,
    t: Target,
    names: set[str],
    cold: bool,
    work: Path,
    server: Store,
    proxied: bool = False,
) -> dict[str, Any]:
    kind = {"gs": "gcs", "az": "azure"}.get(t.url.partition(":")[0], "s3")
    env = {"CKPT_SIDECAR_WATCH__SETTLE_SECONDS": "1.0"}
    state = Path(tempfile.mkdtemp(prefix="state-", dir=work)) if cold else None
    if state is not None:
        env["CKPT_SIDECAR_STATE__DIR"] = str(state)
    stack = contextlib.ExitStack()
    seen: Callable[[], list[tuple[str, str]]] | None = None
    if proxied and isinstance(server, S3Server | Azurite):
        upstream = server.endpoint_url if isinstance(server, S3Server) else server.account_url
        proxy = S3Proxy(upstream)
        stack.callback(proxy.close)
        if isinstance(server, S3Server):
            env["AWS_ENDPOINT_URL_S3"] = proxy.endpoint_url
        else:
            env["CKPT_SIDECAR_DESTINATION__AZURE__ACCOUNT_URL"] = f"{proxy.endpoint_url}/{ACCOUNT}"
        seen = lambda p=proxy: [(r.method, r.path) for r in p.requests]  # noqa: E731
    elif proxied and isinstance(server, GcsServer):
        gproxy = stack.enter_context(gcs_proxy(server))
        env["STORAGE_EMULATOR_HOST"] = gproxy.url
        seen = lambda p=gproxy: [(m, path) for m, path, _ in p.log]  # noqa: E731
    counter, observer = None, None
    if t.local is not None:
        counter = OpenCounter(t.local)
        observer = InotifyObserver()
        observer.schedule(counter, str(t.local), recursive=True)
        observer.start()
    try:
        t0 = time.time()
        d = start_daemon(watch, t, env)
        try:
            ready = d.wait_for("daemon.ready", timeout=120)
            wait_until(d, converged(names), timeout=600)
            events: list[Event] = list(d.events)
        finally:
            stop_daemon(d)
        last = max(
            ts(e)
            for e in events
            if e.get("event") in ("checkpoint.already_committed", "checkpoint.superseded")
        )
        counts: Counter[str] = Counter()
        if seen is not None:
            counts = classify(kind, seen())
        if counter is not None:
            counts = counter.counts
        kinds = Counter(str(e.get("event")) for e in events)
        return {
            "to_ready_s": round(ts(ready) - t0, 2),
            "to_converged_s": round(last - t0, 2),
            "already_committed": kinds["checkpoint.already_committed"],
            "superseded": kinds["checkpoint.superseded"],
            "uploaded_again": kinds["checkpoint.committed"],
            "requests": dict(counts),
            "data_downloads": counts["data GET"] + counts["data"],
        }
    finally:
        if observer is not None:
            observer.stop()
            with contextlib.suppress(RuntimeError):
                observer.join(5)
        stack.close()
        if state is not None:
            shutil.rmtree(state, ignore_errors=True)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--backends", default="file,s3", help="of file, s3, gcs, azure")
    a = p.parse_args()
    report = Report("startup")
    work = Path(tempfile.mkdtemp(prefix="bench-startup-", dir="/tmp"))
    try:
        for backend in a.backends.split(","):
            with store(backend) as server:
                where = store_label(backend, server)
                for shape, (n, each) in SHAPES.items():
                    t = new_target(backend, work, server, "start")
                    watch = work / f"watch-{backend}-{n}"
                    names = build_committed(watch, t, n, each)
                    for cache in ("warm", "cold"):
                        runs = a.runs + (1 if server is not None else 0)
                        for run in range(runs):
                            proxied = run == a.runs
                            r = measure(watch, t, names, cache == "cold", work, server, proxied)
                            row = {
                                "destination": backend,
                                "store": where,
                                "committed": shape,
                                "state_cache": cache,
                                "run": "proxied, for request counts" if proxied else run + 1,
                                **r,
                            }
                            report.rows.append(row)
                            print(row, flush=True)
                    shutil.rmtree(watch, ignore_errors=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    report.finish(table(report.rows), merge_on=("destination", "committed", "state_cache"))


def table(rows: list[dict[str, Any]]) -> str:
    out = []
    groups: dict[tuple[str, str, str], list[dict[str, Any]]] = {}
    for r in rows:
        if not isinstance(r["run"], int):
            continue
        groups.setdefault((r["destination"], r["committed"], r["state_cache"]), []).append(r)
    for (dest, shape, cache), rs in groups.items():
        conv = statistics.median(r["to_converged_s"] for r in rs)
        counted = [
            r
            for r in rows
            if (r["destination"], r["committed"], r["state_cache"]) == (dest, shape, cache)
            and (dest == "file" or not isinstance(r["run"], int))
        ]
        downloads = sum(r["data_downloads"] for r in counted)
        reqs = counted[-1]["requests"] if counted else {}
        again = sum(r["uploaded_again"] for r in rs)
        ok = conv < TARGET_S and downloads == 0 and again == 0
        out.append(
            [
                rs[0].get("store") or KINDS[dest],
                shape,
                cache,
                f"{statistics.median(r['to_ready_s'] for r in rs):.2f}",
                f"**{conv:.2f}**",
                " / ".join(f"{r['to_converged_s']:.2f}" for r in rs),
                f"{rs[0]['already_committed']} / {rs[0]['superseded']} / {again}",
                downloads,
                ", ".join(f"{k} {v}" for k, v in sorted(reqs.items())),
                f"< {TARGET_S:.0f} s, 0 downloads: " + ("met" if ok else "**not met**"),
            ]
        )
    return md_table(
        [
            "destination",
            "10,000 files as",
            "state cache",
            "start -> ready s",
            "start -> converged s (median)",
            "each run",
            "already / superseded / re-uploaded",
            "data objects read",
            "destination requests in one start",
            "target",
        ],
        out,
        right=3,
    )


if __name__ == "__main__":
    main()
