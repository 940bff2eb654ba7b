"""Upload benchmark for the GCS backend on both local emulators, with peers.

    .venv/bin/python bench/gcs_upload.py [--file-mib 2048] [--runs 1]
        [--chunks-mib 16,64,100] [--tools ours,library,rclone]
        [--servers gcp-storage-emulator,fake-gcs-server]

One file of random bytes is uploaded to gcp-storage-emulator and to fake-gcs-server
(in memory, on a free loopback port). Every run gets a freshly started emulator, stopped
after it: both keep all bytes in memory (fake-gcs-server grew past 12 GB during one
2 GiB upload in 16 MiB chunks). Each upload runs as a child process; its CPU
(user + sys) comes from ``wait4``, its peak RSS from sampling (``ru_maxrss`` would
include the parent's, inherited at fork), the emulator's CPU from psutil.
MB/s = 10^6 bytes per wall second; CPU s/GB = CPU seconds per 10^9 bytes.

Tools: ``ours`` = sidecar.storage.gcs.GcsBackend.put_file (resumable session, CRC32C in
the same pass, sent with the final chunk); ``library`` = google-cloud-storage's own
``Blob.upload_from_filename`` with the same chunk sizes and ``checksum="crc32c"``;
``rclone`` = ``rclone copyto`` (its own chunk size; fake-gcs-server only: it fails on
gcp-storage-emulator's resumable answers). The machine is shared: numbers are indicative.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import psutil

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

MiB = 1024 * 1024


def child(tool: str, host: str, bucket: str, src: Path, chunk_mib: int) -> None:
    """One upload, in this (child) process."""
    if tool == "ours":
        from sidecar.storage.gcs import GcsBackend
        from sidecar.storage.options import GcsOptions

        backend = GcsBackend(
            bucket, "bench", GcsOptions(chunk_size_bytes=chunk_mib * MiB), emulator_host=host
        )
        backend.put_file(src.name, src)
        backend.close()
    elif tool == "library":
        from google.auth.credentials import AnonymousCredentials
        from google.cloud import storage

        client = storage.Client(
            project="bench",
            credentials=AnonymousCredentials(),  # type: ignore[no-untyped-call]
            client_options={"api_endpoint": host},
        )
        blob = client.bucket(bucket).blob(f"bench/{src.name}", chunk_size=chunk_mib * MiB or None)
        blob.upload_from_filename(str(src), checksum="crc32c")
    else:
        raise SystemExit(f"unknown tool {tool}")


@dataclass
class Result:
    server: str
    tool: str
    chunk_mib: int
    seconds: float
    cpu: float
    server_cpu: float
    rss_mib: float


def _peak_rss(pid: int, done: threading.Event, peak: list[int]) -> None:
    """Sample the child's RSS (wait4's ru_maxrss would include the parent's, from fork)."""
    try:
        proc = psutil.Process(pid)
        while not done.wait(0.05):
            peak[0] = max(peak[0], proc.memory_info().rss)
    except psutil.Error:
        pass


def _run(cmd: list[str], server_pid: int) -> tuple[float, float, float, float]:
    srv = psutil.Process(server_pid)
    before = sum(srv.cpu_times()[:2])
    start = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    done, peak = threading.Event(), [0]
    sampler = threading.Thread(target=_peak_rss, args=(proc.pid, done, peak))
    sampler.start()
    _, status, usage = os.wait4(proc.pid, 0)
    seconds = time.perf_counter() - start
    done.set()
    sampler.join()
    if status != 0:
        err = proc.stderr.read().decode(errors="replace")[-1500:] if proc.stderr else ""
        raise RuntimeError(f"{cmd[:4]} failed: {err}")
    after = sum(srv.cpu_times()[:2])
    return seconds, usage.ru_utime + usage.ru_stime, after - before, peak[0] / MiB


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--file-mib", type=int, default=2048)
    ap.add_argument("--runs", type=int, default=1)
    ap.add_argument("--chunks-mib", default="16,64,100")
    ap.add_argument("--tools", default="ours,library,rclone")
    ap.add_argument("--servers", default="gcp-storage-emulator,fake-gcs-server")
    ap.add_argument("--child", nargs=5, metavar=("TOOL", "HOST", "BUCKET", "FILE", "CHUNK"))
    args = ap.parse_args()
    if args.child:
        tool, host, bucket, src, chunk = args.child
        child(tool, host, bucket, Path(src), int(chunk))
        return

    from tests.servers.gcs import start_fake_gcs_server, start_gcp_storage_emulator, stop

    work = Path(tempfile.mkdtemp(prefix="gcs-bench-"))
    src = work / f"checkpoint-{args.file_mib}MiB.bin"
    with open(src, "wb") as f:
        for _ in range(args.file_mib):
            f.write(os.urandom(MiB))
    size = src.stat().st_size
    starters = {
        "gcp-storage-emulator": start_gcp_storage_emulator,
        "fake-gcs-server": start_fake_gcs_server,
    }
    results: list[Result] = []
    plan = [
        (name, tool, chunk)
        for name in args.servers.split(",")
        for tool in args.tools.split(",")
        if tool != "rclone" or (name == "fake-gcs-server" and shutil.which("rclone"))
        for chunk in ([0] if tool == "rclone" else [int(c) for c in args.chunks_mib.split(",")])
        for _ in range(args.runs)
    ]
    try:
        for name, tool, chunk in plan:
            # a fresh emulator each run: both keep every byte (and their garbage) in memory
            server = starters[name](work)
            try:
                bucket = server.new_bucket("bench")
                if tool == "rclone":
                    cmd = [
                        "rclone", "copyto", str(src), f":gcs:{bucket}/bench/{src.name}",
                        "--gcs-endpoint", f"{server.url}/storage/v1/", "--gcs-anonymous",
                        "--gcs-no-check-bucket",
                    ]  # fmt: skip
                else:
                    cmd = [
                        sys.executable, __file__, "--child", tool, server.url, bucket, str(src),
                        str(chunk),
                    ]  # fmt: skip
                m = _run(cmd, server.process.pid)
                results.append(Result(name, tool, chunk, m[0], m[1], m[2], m[3]))
                print(f"# {results[-1]}", file=sys.stderr, flush=True)
            finally:
                stop(server)
    finally:
        shutil.rmtree(work, ignore_errors=True)

    groups: dict[tuple[str, str, int], list[Result]] = {}
    for r in results:
        groups.setdefault((r.server, r.tool, r.chunk_mib), []).append(r)
    print(f"file: {size / MiB:.0f} MiB, runs: {args.runs} (median)")
    print("| server | tool | chunk | MB/s | client CPU s/GB | emulator CPU s/GB | client RSS MiB |")
    print("|---|---|---|---|---|---|---|")
    for (server_name, tool, chunk), rs in groups.items():
        secs = statistics.median(r.seconds for r in rs)
        cpu = statistics.median(r.cpu for r in rs)
        scpu = statistics.median(r.server_cpu for r in rs)
        rss = max(r.rss_mib for r in rs)
        label = f"{chunk} MiB" if chunk else "default"
        print(
            f"| {server_name} | {tool} | {label} | {size / 1e6 / secs:.0f} | "
            f"{cpu / (size / 1e9):.2f} | {scpu / (size / 1e9):.2f} | {rss:.0f} |"
        )


if __name__ == "__main__":
    main()
