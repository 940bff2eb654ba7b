"""The CPU one S3 UploadPart costs our client, by body size: what part size buys.

Our S3 backend sends each part with one botocore ``upload_part`` call. This times that call
alone, in this process, against a local SeaweedFS (the server the tests use): one thread,
the same client ``S3Backend`` builds (``make_client``), bodies of random bytes already in
memory with their CRC32C computed beforehand, so neither the file read nor the checksum is
in the figures. For each body size it sends ``--requests`` parts (fewer for large bodies,
at least 16) and reads this process's CPU time (``getrusage``, user + system) and the wall
clock around them. Each case runs with ``Expect: 100-continue`` and without, in alternation,
``--runs`` times (the backend sends it with bodies of at least
``s3_client.EXPECT_CONTINUE_MIN_BYTES``). The table gives the median CPU and wall time per
request and the CPU per GB it adds up to when a whole file goes up in parts of that size.

    .venv/bin/python -m bench.s3_request_cost --runs 3
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import time
from typing import Any

from botocore.handlers import add_expect_header

from bench._common import KiB, MiB, Report, md_table, s3_env, seaweedfs
from sidecar.storage import s3_client
from sidecar.storage.checksum import Crc32c
from sidecar.storage.options import S3Options
from tests.servers.seaweedfs import new_bucket


def _cpu() -> float:
    ru = resource.getrusage(resource.RUSAGE_SELF)
    return ru.ru_utime + ru.ru_stime


def send_parts(client: Any, bucket: str, size: int, count: int) -> tuple[float, float]:
    """CPU and wall seconds per ``upload_part`` of ``size`` bytes, over ``count`` parts."""
    body = os.urandom(size)
    crc = Crc32c()
    crc.update(body)
    key = f"k{size}"
    upload = client.create_multipart_upload(Bucket=bucket, Key=key, ChecksumAlgorithm="CRC32C")
    before = _cpu()
    started = time.perf_counter()
    for number in range(1, count + 1):
        client.upload_part(
            Bucket=bucket,
            Key=key,
            UploadId=upload["UploadId"],
            PartNumber=number,
            Body=body,
            ChecksumCRC32C=crc.b64(),
        )
    spent = _cpu() - before
    wall = time.perf_counter() - started
    client.abort_multipart_upload(Bucket=bucket, Key=key, UploadId=upload["UploadId"])
    return spent / count, wall / count


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--sizes-kib", default="1,8192,16384,32768", help="body sizes in KiB")
    ap.add_argument("--requests", type=int, default=300, help="parts per case (small bodies)")
    ap.add_argument("--mib-per-case", type=int, default=512, help="bytes per case, large bodies")
    args = ap.parse_args()
    report = Report("s3_request_cost")
    sizes = [int(x) * KiB for x in args.sizes_kib.split(",")]
    per: dict[tuple[int, str], list[tuple[float, float]]] = {}
    with seaweedfs() as server:
        os.environ.update(s3_env(server))
        with_expect = s3_client.make_client(S3Options(), pool_size=4)
        # on every body, not only large ones as the backend does
        with_expect.meta.events.unregister(
            "before-call.s3",
            s3_client.no_expect_for_small_bodies,
        )
        without = s3_client.make_client(S3Options(), pool_size=4)
        without.meta.events.unregister("before-call.s3", add_expect_header)
        clients = {"yes": with_expect, "no": without}
        bucket = new_bucket(server, "bench-cost")
        for run in range(args.runs):
            for size in sizes:
                count = max(16, min(args.requests, args.mib_per_case * MiB // size))
                for expect, client in clients.items():
                    cpu, wall = send_parts(client, bucket, size, count)
                    per.setdefault((size, expect), []).append((cpu, wall))
                    print(
                        f"run {run + 1}: {size // KiB} KiB, Expect {expect}: "
                        f"{cpu * 1e3:.2f} ms CPU, {wall * 1e3:.2f} ms wall"
                    )
    rows = []
    for (size, expect), costs in per.items():
        cpu_ms = [c * 1e3 for c, _ in costs]
        wall_ms = [w * 1e3 for _, w in costs]
        report.rows.append(
            {
                "body_bytes": size,
                "expect_100_continue": expect,
                "cpu_ms_per_request": cpu_ms,
                "wall_ms_per_request": wall_ms,
            }
        )
        ms = statistics.median(cpu_ms)
        per_gb = ms / 1e3 * (1e9 / size)
        rows.append(
            [
                f"{size // KiB:,} KiB",
                expect,
                f"{ms:.2f}",
                f"{statistics.median(wall_ms):.2f}",
                f"{per_gb:.2f}" if size >= MiB else "-",
            ]
        )
    report.finish(
        md_table(
            [
                "UploadPart body",
                "Expect: 100-continue",
                "CPU ms per request (median)",
                "wall ms per request (median)",
                "CPU-s per GB in parts of this size",
            ],
            rows,
            right=2,
        )
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
