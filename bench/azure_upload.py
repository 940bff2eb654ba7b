"""Azure block-upload throughput and CPU per GB against a local Azurite.

Usage: .venv/bin/python -m bench.azure_upload [--size-mib 2048] [--settings 4x4,16x8,...]

For each ``<block MiB>x<concurrency>`` a fresh Azurite (in memory) is started, one file is
uploaded through ``AzureBackend.put_file`` (read, CRC32C, MD5 per block, staged blocks,
commit), and the wall time, this process's CPU time and Azurite's CPU time are printed as
a Markdown table. Needs ``npm ci`` (Azurite); Linux (CPU times from /proc).
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from pathlib import Path

from sidecar.storage.azure import create
from sidecar.storage.url import parse_destination
from tests.servers.azurite import Azurite, start_azurite

MiB = 1024 * 1024
DEFAULT_SETTINGS = "4x4,4x16,16x4,16x8,16x16,64x4,64x8,64x16"


def _make_file(path: Path, size: int) -> None:
    with open(path, "wb") as f:
        left = size
        while left:
            n = min(left, 64 * MiB)
            f.write(os.urandom(n))
            left -= n


def _cpu_seconds(pid: int) -> float:
    """User + system CPU of a process, from /proc (Linux)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def run_one(server: Azurite, src: Path, block_mib: int, concurrency: int) -> tuple[float, ...]:
    container = server.new_container()
    dest = server.destination(
        f"az://{container}/bench", block_size_bytes=block_mib * MiB, max_concurrency=concurrency
    )
    backend = create(parse_destination(dest.url), dest)
    server_cpu0 = _cpu_seconds(server.pid)
    cpu0, wall0 = time.process_time(), time.perf_counter()
    info = backend.put_file("model.pt", src)
    wall, cpu = time.perf_counter() - wall0, time.process_time() - cpu0
    server_cpu = _cpu_seconds(server.pid) - server_cpu0
    backend.close()
    gb = info.size / 1e9
    return info.size / wall / 1e6, cpu / gb, server_cpu / gb, wall


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--size-mib", type=int, default=2048)
    ap.add_argument("--settings", default=DEFAULT_SETTINGS)
    args = ap.parse_args()
    settings = [tuple(int(v) for v in s.split("x")) for s in args.settings.split(",")]
    with tempfile.TemporaryDirectory(prefix="azure-bench-") as tmp:
        src = Path(tmp) / "model.pt"
        _make_file(src, args.size_mib * MiB)
        print(f"file: {args.size_mib} MiB random bytes; one upload per row, fresh Azurite each")
        print("| block | concurrency | MB/s | client CPU s/GB | Azurite CPU s/GB | wall s |")
        print("|---|---|---|---|---|---|")
        for block_mib, concurrency in settings:
            with start_azurite(
                Path(tmp) / f"azurite-{block_mib}x{concurrency}",
                memory_limit_mb=args.size_mib * 2 + 512,
            ) as server:
                mbps, cpu, server_cpu, wall = run_one(server, src, block_mib, concurrency)
            print(
                f"| {block_mib} MiB | {concurrency} | {mbps:.0f} | {cpu:.2f} | "
                f"{server_cpu:.2f} | {wall:.1f} |",
                flush=True,
            )


if __name__ == "__main__":
    main()
