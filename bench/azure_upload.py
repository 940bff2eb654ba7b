"""Azure block-upload throughput and CPU per GB against a local Azurite, with peers.

Usage: .venv/bin/python -m bench.azure_upload [--size-mib 2048] [--settings 4x4,16x8,...]
    [--tools ours,library,rclone] [--runs 1] [--timeout 1800]

For each ``<block MiB>x<concurrency>`` setting, each tool and each run, a fresh Azurite (in
memory) is started and one file of random bytes is uploaded by a child process (its own
session, killed with its children after ``--timeout`` seconds), so interpreter start-up
and imports count for every tool alike. Client CPU is the child's user + system time from
``wait4`` (reaped children included), its peak RSS is sampled over its process tree,
Azurite's CPU comes from psutil. The Python children (``ours``, ``library``) print their CPU
before the first byte (interpreter start, imports, client set-up; ``setup_done()`` in
bench/_child.py), and the table shows the client CPU per GB with and without it ("n/a"
for rclone). After each run the blob's size is read back: a run that
does not leave every byte in the blob counts as failed and is listed under the table,
never measured. Medians over runs; RSS is the largest. ``bench/azure.json`` gets every run
(a run of some settings keeps the other rows of earlier runs, each with its own date).
Needs ``npm ci`` (Azurite).

Tools: ``ours`` = ``AzureBackend.put_file`` (one read pass, whole-file CRC32C, a CRC-64
per block sent as ``x-ms-content-crc64``, blocks staged in parallel, then the block list
committed); ``library`` = azure-storage-blob's own ``BlobClient.upload_blob`` on the open
file (client built with ``max_block_size`` and ``max_single_put_size`` = the block size;
``max_concurrency`` = the concurrency, ``validate_content=True``: an MD5 per block);
``rclone`` = ``rclone copyto`` to ``:azureblob:`` with ``--azureblob-use-emulator
--azureblob-endpoint <Azurite URL>``, ``--azureblob-chunk-size`` = the block size,
``--azureblob-upload-concurrency`` = the concurrency. ``--tools`` defaults to ``ours``.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path

MiB = 1024 * 1024
DEFAULT_SETTINGS = "4x4,4x16,16x4,16x8,16x16,64x4,64x8,64x16"
TOOLS = ("ours", "library", "rclone")
PREFIX, NAME = "bench", "model.pt"
BLOB = f"{PREFIX}/{NAME}"
ROOT = Path(__file__).resolve().parent.parent
KEY_ENV = "BENCH_AZURITE_KEY"  # the parent hands Azurite's published key to its children


def _make_file(path: Path, size: int) -> None:
    with open(path, "wb") as f:
        left = size
        while left:
            n = min(left, 64 * MiB)
            f.write(os.urandom(n))
            left -= n


# ---------------------------------------------------------------- child side: one upload


def child(
    tool: str, account_url: str, container: str, src: Path, block_mib: int, concurrency: int
) -> None:
    """One upload, in this (child) process; ``setup_done()`` prints its CPU so far once the
    client is built, before the first byte is read."""
    from bench._child import setup_done

    key = os.environ[KEY_ENV]
    if tool == "ours":
        from pydantic import SecretStr

        from sidecar.config import DestinationConfig
        from sidecar.storage.azure import create
        from sidecar.storage.options import AzureOptions
        from sidecar.storage.url import parse_destination

        dest = DestinationConfig(
            url=f"az://{container}/{PREFIX}",
            azure=AzureOptions(
                account_url=account_url,
                account_key=SecretStr(key),
                block_size_bytes=block_mib * MiB,
                max_concurrency=concurrency,
            ),
        )
        backend = create(parse_destination(dest.url), dest)
        setup_done()
        backend.put_file(NAME, src)
        backend.close()
    elif tool == "library":
        from azure.storage.blob import BlobClient

        account = account_url.rstrip("/").rsplit("/", 1)[1]
        with (
            BlobClient(
                account_url,
                container,
                BLOB,
                credential={"account_name": account, "account_key": key},
                max_block_size=block_mib * MiB,
                max_single_put_size=block_mib * MiB,
            ) as blob,
            open(src, "rb") as f,
        ):
            length = src.stat().st_size
            setup_done()
            blob.upload_blob(
                f,
                length=length,
                max_concurrency=concurrency,
                validate_content=True,
                overwrite=True,
            )
    else:
        raise SystemExit(f"unknown tool {tool}")


# ---------------------------------------------------------------- parent side: measure


def command(
    tool: str, account_url: str, container: str, src: Path, block_mib: int, concurrency: int
) -> list[str]:
    if tool == "rclone":
        return [
            "rclone", "copyto", str(src), f":azureblob:{container}/{BLOB}",
            "--azureblob-use-emulator", "--azureblob-endpoint", account_url,
            "--azureblob-chunk-size", f"{block_mib}Mi",
            "--azureblob-upload-concurrency", str(concurrency),
        ]  # fmt: skip
    return [
        sys.executable, "-m", "bench.azure_upload", "--child", tool, account_url, container,
        str(src), str(block_mib), str(concurrency),
    ]  # fmt: skip


@dataclass
class Result:
    tool: str
    block_mib: int
    concurrency: int
    seconds: float
    cpu: float
    server_cpu: float
    rss_mib: float
    setup_cpu: float | None  # CPU before the first byte (our Python children only)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--size-mib", type=int, default=2048)
    ap.add_argument("--settings", default=DEFAULT_SETTINGS)
    ap.add_argument("--tools", default="ours")
    ap.add_argument("--runs", type=int, default=1)
    ap.add_argument("--timeout", type=float, default=1800, help="seconds per upload")
    ap.add_argument("--child", nargs=6, metavar=("TOOL", "URL", "CONTAINER", "FILE", "B", "C"))
    args = ap.parse_args()
    if args.child:
        tool, url, container, src, block, conc = args.child
        child(tool, url, container, Path(src), int(block), int(conc))
        return

    from azure.core.exceptions import ResourceNotFoundError

    from bench._common import Report, measure_child, start_up_columns
    from tests.servers.azurite import KEY, start_azurite

    settings = [tuple(int(v) for v in s.split("x")) for s in args.settings.split(",")]
    failures: list[str] = []
    tools = []
    for tool in args.tools.split(","):
        if tool not in TOOLS:
            raise SystemExit(f"unknown tool {tool}; known: {', '.join(TOOLS)}")
        if tool == "rclone" and not shutil.which("rclone"):
            failures.append("rclone: not installed (apt-get install -y rclone)")
        else:
            tools.append(tool)
    # run 1 of every (setting, tool), then run 2...: drifting load hits every tool alike
    plan = [(b, c, t) for _ in range(args.runs) for b, c in settings for t in tools]
    env = {**os.environ, KEY_ENV: KEY, "RCLONE_CONFIG": os.devnull}
    results: list[Result] = []
    report = Report("azure")
    with tempfile.TemporaryDirectory(prefix="azure-bench-") as tmp:
        src = Path(tmp) / "model.pt"
        _make_file(src, args.size_mib * MiB)
        size = src.stat().st_size
        for i, (block_mib, concurrency, tool) in enumerate(plan):
            label = f"{tool} {block_mib}x{concurrency}"
            with start_azurite(
                Path(tmp) / f"azurite-{i}", memory_limit_mb=args.size_mib * 2 + 512
            ) as server:
                container = server.new_container()
                cmd = command(tool, server.account_url, container, src, block_mib, concurrency)
                m = measure_child(cmd, env, server.pid, args.timeout, cwd=ROOT)
                with server.service() as service:
                    try:
                        blob = service.get_blob_client(container, BLOB)
                        stored: int | None = blob.get_blob_properties().size
                    except ResourceNotFoundError:
                        stored = None
            if isinstance(m, str):
                outcome = f"{m} (bytes stored: {stored})"
                failures.append(f"{label}: {outcome}")
            elif stored != size:
                outcome = f"exit 0 but {stored} of {size} bytes stored"
                failures.append(f"{label}: {outcome}")
            else:
                results.append(Result(tool, block_mib, concurrency, *m))
                outcome = str(results[-1])
            print(f"# {label}: {outcome}", file=sys.stderr, flush=True)

    groups: dict[tuple[str, int, int], list[Result]] = {}
    for r in results:
        groups.setdefault((r.tool, r.block_mib, r.concurrency), []).append(r)
    lines = [
        f"file: {args.size_mib} MiB random bytes; fresh Azurite per run; median of runs",
        "client start-up CPU s = the child's CPU before its first byte (interpreter, imports,"
        " client set-up), printed by the Python children only (n/a for rclone)",
        "",
        "| tool | block | concurrency | runs | MB/s | client CPU s/GB |"
        " client start-up CPU s | client CPU s/GB after start-up | Azurite CPU s/GB |"
        " client RSS MiB | wall s |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    gb = size / 1e9
    for (tool, block_mib, concurrency), rs in sorted(
        groups.items(), key=lambda kv: (kv[0][1], kv[0][2], TOOLS.index(kv[0][0]))
    ):
        secs = statistics.median(r.seconds for r in rs)
        setup, after = start_up_columns([(r.cpu, r.setup_cpu, size) for r in rs])
        lines.append(
            f"| {tool} | {block_mib} MiB | {concurrency} | {len(rs)} | {size / 1e6 / secs:.0f} | "
            f"{statistics.median(r.cpu for r in rs) / gb:.2f} | "
            f"{setup} | {after} | "
            f"{statistics.median(r.server_cpu for r in rs) / gb:.2f} | "
            f"{max(r.rss_mib for r in rs):.0f} | {secs:.1f} |"
        )
    rows = [{**asdict(r), "size_bytes": size} for r in results]
    report.finish_uploads(lines, rows, failures, merge_on=("tool", "block_mib", "concurrency"))


if __name__ == "__main__":
    main()
