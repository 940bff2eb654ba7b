"""Upload benchmark for the GCS backend on both local emulators, with peers.

    .venv/bin/python bench/gcs_upload.py [--file-mib 2048] [--runs 1]
        [--chunks-mib 16,64,100] [--tools ours,library,gsutil,gcloud,rclone]
        [--servers gcp-storage-emulator,fake-gcs-server] [--try-all] [--timeout 1800]

One file of random bytes is uploaded to gcp-storage-emulator and to fake-gcs-server
(in memory, on a free loopback port). Every run gets a freshly started emulator, stopped
after it: both keep all bytes in memory (fake-gcs-server grew past 12 GB during one
2 GiB upload in 16 MiB chunks). Each upload runs as a child process (its own session,
killed with its children after ``--timeout`` seconds); its CPU (user + sys, reaped
children included) comes from ``wait4``, its peak RSS from sampling the child's process
tree (``ru_maxrss`` would include the parent's, inherited at fork), the emulator's CPU
from psutil. The Python children (``ours``, ``library``) print their CPU before the first
byte (interpreter start, imports, client set-up; ``setup_done()`` in bench/_child.py), and
the table shows the client CPU per GB with and without it ("n/a" for the other tools).
After each run the object's size is read back from the emulator: a run that exits 0
without storing every byte counts as failed. Failed runs are listed under the
table with the tail of their error, never measured.
MB/s = 10^6 bytes per wall second; CPU s/GB = CPU seconds per 10^9 bytes. ``bench/gcs.json``
gets every run (a run of some pairs keeps the other rows of earlier runs, with their date).

Tools: ``ours`` = sidecar.storage.gcs.GcsBackend.put_file (resumable session streamed
from the file, CRC32C in the same pass, sent with the last 256 KiB; ``--chunks-mib 0``:
its default, one request); ``library`` = google-cloud-storage's own
``Blob.upload_from_filename`` with the same chunk sizes (0: its default, 100 MiB) and
``checksum="crc32c"``;
``gcloud`` = ``gcloud storage cp`` (endpoint from ``CLOUDSDK_API_ENDPOINT_OVERRIDES_STORAGE``,
``auth/disable_credentials``, parallel composite uploads off: one resumable session, the
whole file in one request; a throwaway ``CLOUDSDK_CONFIG``); ``gsutil`` = ``gsutil cp``
(JSON API, ``Credentials:gs_json_host``/``gs_json_port``, empty throwaway ``BOTO_CONFIG``);
``rclone`` = ``rclone copyto`` (its own chunk size).

Not every tool works on every emulator; by default the plan leaves out the pairs in
``UNSUPPORTED`` (the reason is printed), ``--try-all`` runs them anyway: ``gsutil`` on
neither (gsutil 5.34 builds every JSON API URL with ``https://``; its XML API is answered
501 by gcp-storage-emulator and 404 by fake-gcs-server); ``gcloud`` and ``rclone`` on
fake-gcs-server only (gcp-storage-emulator answers 501 to gcloud's
``POST /resumable/upload/...``; rclone fails on its resumable answers). The machine is
shared: numbers are indicative.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import urllib.error
import urllib.request
from dataclasses import asdict, dataclass
from pathlib import Path
from urllib.parse import quote, urlsplit

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

MiB = 1024 * 1024
TOOLS = ("ours", "library", "gsutil", "gcloud", "rclone")
CHUNKED = ("ours", "library")  # the tools that take --chunks-mib; the others use their own
UNSUPPORTED = {
    ("gcp-storage-emulator", "gsutil"): "JSON API is https-only in gsutil; XML API: 501",
    ("fake-gcs-server", "gsutil"): "JSON API is https-only in gsutil; XML API: 404",
    ("gcp-storage-emulator", "gcloud"): "501 on POST /resumable/upload/storage/v1/...",
    ("gcp-storage-emulator", "rclone"): "unexpected 308 response status code",
}


def child(tool: str, host: str, bucket: str, src: Path, chunk_mib: int) -> None:
    """One upload, in this (child) process; ``setup_done()`` prints its CPU so far once the
    client is built, before the first byte is read."""
    from bench._child import setup_done

    if tool == "ours":
        from sidecar.storage.gcs import GcsBackend
        from sidecar.storage.options import GcsOptions

        backend = GcsBackend(
            bucket,
            "bench",
            GcsOptions(chunk_size_bytes=chunk_mib * MiB or None),
            emulator_host=host,
        )
        setup_done()
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
        setup_done()
        blob.upload_from_filename(str(src), checksum="crc32c")
    else:
        raise SystemExit(f"unknown tool {tool}")


def command(
    tool: str, url: str, bucket: str, src: Path, chunk_mib: int, conf: Path
) -> tuple[list[str], dict[str, str]]:
    """The command line and environment of one upload by ``tool``."""
    dest = f"gs://{bucket}/bench/{src.name}"
    env = dict(os.environ)
    # gcloud and gsutil: a throwaway config dir, no credentials, no calls to anything else
    env.update(
        CLOUDSDK_CONFIG=str(conf / "gcloud"),
        BOTO_CONFIG=str(conf / "boto"),
        CLOUDSDK_CORE_DISABLE_USAGE_REPORTING="true",
        CLOUDSDK_COMPONENT_MANAGER_DISABLE_UPDATE_CHECK="true",
        CLOUDSDK_SURVEY_DISABLE_PROMPTS="true",
        CLOUDSDK_CORE_CHECK_GCE_METADATA="false",
        CLOUDSDK_CORE_PASS_CREDENTIALS_TO_GSUTIL="false",
        CLOUDSDK_AUTH_DISABLE_CREDENTIALS="true",
    )
    if tool == "gcloud":
        env.update(
            CLOUDSDK_API_ENDPOINT_OVERRIDES_STORAGE=f"{url}/",
            CLOUDSDK_STORAGE_PARALLEL_COMPOSITE_UPLOAD_ENABLED="False",
            CLOUDSDK_STORAGE_MAX_RETRIES="3",
        )
        return ["gcloud", "storage", "cp", str(src), dest], env
    if tool == "gsutil":
        where = urlsplit(url)
        return [
            "gsutil", "-o", f"Credentials:gs_json_host={where.hostname}",
            "-o", f"Credentials:gs_json_port={where.port}", "-o", "Boto:num_retries=1",
            "cp", str(src), dest,
        ], env  # fmt: skip
    if tool == "rclone":
        return [
            "rclone", "copyto", str(src), f":gcs:{bucket}/bench/{src.name}",
            "--gcs-endpoint", f"{url}/storage/v1/", "--gcs-anonymous", "--gcs-no-check-bucket",
        ], env  # fmt: skip
    return [sys.executable, __file__, "--child", tool, url, bucket, str(src), str(chunk_mib)], env


def stored_size(url: str, bucket: str, name: str) -> int | None:
    """The size the emulator reports for ``bench/<name>``, or None if it has no such object."""
    obj = quote(f"bench/{name}", safe="")
    try:
        with urllib.request.urlopen(f"{url}/storage/v1/b/{bucket}/o/{obj}", timeout=30) as r:
            return int(json.load(r)["size"])
    except urllib.error.HTTPError as e:
        if e.code == 404:
            return None
        raise


@dataclass
class Result:
    server: str
    tool: str
    chunk_mib: int
    seconds: float
    cpu: float
    server_cpu: float
    rss_mib: float
    setup_cpu: float | None  # CPU before the first byte (our Python children only)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--file-mib", type=int, default=2048)
    ap.add_argument("--runs", type=int, default=1)
    ap.add_argument("--chunks-mib", default="16,64,100")
    ap.add_argument("--tools", default=",".join(TOOLS))
    ap.add_argument("--servers", default="gcp-storage-emulator,fake-gcs-server")
    ap.add_argument("--try-all", action="store_true", help="also run the pairs in UNSUPPORTED")
    ap.add_argument("--timeout", type=float, default=1800, help="seconds per upload")
    ap.add_argument("--child", nargs=5, metavar=("TOOL", "HOST", "BUCKET", "FILE", "CHUNK"))
    args = ap.parse_args()
    if args.child:
        tool, host, bucket, src, chunk = args.child
        child(tool, host, bucket, Path(src), int(chunk))
        return

    from bench._common import Report, measure_child, start_up_columns
    from tests.servers.gcs import start_fake_gcs_server, start_gcp_storage_emulator, stop

    starters = {
        "gcp-storage-emulator": start_gcp_storage_emulator,
        "fake-gcs-server": start_fake_gcs_server,
    }
    tools = args.tools.split(",")
    for tool in tools:
        if tool not in TOOLS:
            raise SystemExit(f"unknown tool {tool}; known: {', '.join(TOOLS)}")
    failures: list[str] = []
    pairs = []
    for name in args.servers.split(","):
        for tool in tools:
            if tool not in CHUNKED and not shutil.which(tool):
                failures.append(f"{name} / {tool}: not installed")
                continue
            if (name, tool) in UNSUPPORTED and not args.try_all:
                failures.append(f"{name} / {tool}: not run ({UNSUPPORTED[name, tool]})")
                continue
            chunks = [int(c) for c in args.chunks_mib.split(",")] if tool in CHUNKED else [0]
            pairs += [(name, tool, chunk) for chunk in chunks]
    plan = [p for _ in range(args.runs) for p in pairs]  # run 1 of everything, then run 2...

    report = Report("gcs")
    work = Path(tempfile.mkdtemp(prefix="gcs-bench-"))
    src = work / f"checkpoint-{args.file_mib}MiB.bin"
    with open(src, "wb") as f:
        for _ in range(args.file_mib):
            f.write(os.urandom(MiB))
    size = src.stat().st_size
    results: list[Result] = []
    try:
        for name, tool, chunk in plan:
            conf = Path(tempfile.mkdtemp(prefix="conf-", dir=work))  # fresh per run
            (conf / "boto").touch()
            # a fresh emulator each run: both keep every byte (and their garbage) in memory
            server = starters[name](work)
            try:
                bucket = server.new_bucket("bench")
                cmd, env = command(tool, server.url, bucket, src, chunk, conf)
                m = measure_child(cmd, env, server.process.pid, args.timeout)
                got = stored_size(server.url, bucket, src.name)
                label = f"{name} / {tool} / {chunk or 'default'}"
                if isinstance(m, str):
                    outcome = f"{' | '.join(m.splitlines())} (bytes stored: {got})"
                    failures.append(f"{label}: {outcome}")
                elif got != size:
                    outcome = f"exit 0 but {got} of {size} bytes stored"
                    failures.append(f"{label}: {outcome}")
                else:
                    results.append(Result(name, tool, chunk, *m))
                    outcome = str(results[-1])
                print(f"# {label}: {outcome}", file=sys.stderr, flush=True)
            finally:
                stop(server)
                shutil.rmtree(conf, ignore_errors=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)

    groups: dict[tuple[str, str, int], list[Result]] = {}
    for r in results:
        groups.setdefault((r.server, r.tool, r.chunk_mib), []).append(r)
    lines = [
        f"file: {size / MiB:.0f} MiB, runs: {args.runs} (median)",
        "client start-up CPU s = the child's CPU before its first byte (interpreter, imports,"
        " client set-up), printed by the Python children only (n/a for the others)",
        "",
        "| server | tool | chunk | runs | MB/s | client CPU s/GB | client start-up CPU s |"
        " client CPU s/GB after start-up | emulator CPU s/GB | client RSS MiB |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for (server_name, tool, chunk), rs in groups.items():
        secs = statistics.median(r.seconds for r in rs)
        cpu = statistics.median(r.cpu for r in rs)
        scpu = statistics.median(r.server_cpu for r in rs)
        rss = max(r.rss_mib for r in rs)
        gb = size / 1e9
        setup, after = start_up_columns([(r.cpu, r.setup_cpu, size) for r in rs])
        label = f"{chunk} MiB" if chunk else "default"
        lines.append(
            f"| {server_name} | {tool} | {label} | {len(rs)} | {size / 1e6 / secs:.0f} | "
            f"{cpu / gb:.2f} | {setup} | {after} | {scpu / gb:.2f} | {rss:.0f} |"
        )
    rows = [{**asdict(r), "size_bytes": size} for r in results]
    report.finish_uploads(lines, rows, failures, merge_on=("server", "tool", "chunk_mib"))


if __name__ == "__main__":
    main()
