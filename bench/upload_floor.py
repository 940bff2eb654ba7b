"""The floor under any upload's client CPU on this machine: read, checksum, send, no HTTP.

What every upload of a file must do, timed alone, in this process: read the file once from
the page cache into a reused 8 MiB buffer (``readinto``), CRC32C each buffer (awscrt, what
the backends use), and send it over a loopback TCP connection in sends of ``body.BLOCK``
(1 MiB since 8e8f438, 128 KiB before; what the S3, GCS and Azure clients do) to a receiver
in another process that throws it away. Each step is timed on its own and then all three in
one pass, in turn, ``--runs`` times; CPU is this process's user + system (``getrusage``), per
GB = 10^9 bytes. The receiver's CPU is not counted, but on loopback the kernel does part of
the receiving side's TCP work on the sender's CPU, so "send" is an upper bound of what a
real network card costs.

An upload's CPU per GB less the "all" column is what its protocol (HTTP, signing, the
store's replies) and its threads add: bench/s3.md compares.

    .venv/bin/python -m bench.upload_floor --runs 6
"""

from __future__ import annotations

import argparse
import os
import resource
import socket
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from bench._common import MiB, Report, md_table, write_file
from sidecar.storage.body import BLOCK
from sidecar.storage.checksum import Crc32c

PART = 8 * MiB
STEPS = ("read", "crc32c", "send", "all")

_RECEIVER = """
import socket
srv = socket.socket()
srv.bind(("127.0.0.1", 0))
srv.listen(1)
print(srv.getsockname()[1], flush=True)
conn, _ = srv.accept()
buf = bytearray(1 << 20)
while conn.recv_into(buf):
    pass
"""


def _cpu() -> float:
    ru = resource.getrusage(resource.RUSAGE_SELF)
    return ru.ru_utime + ru.ru_stime


def one_pass(path: Path, size: int, step: str) -> float:
    """CPU seconds per GB of one pass over ``path`` doing ``step`` (see ``STEPS``)."""
    read = step in ("read", "all")
    crc = step in ("crc32c", "all")
    send = step in ("send", "all")
    receiver = None
    sock = None
    if send:
        receiver = subprocess.Popen(
            [sys.executable, "-c", _RECEIVER], stdout=subprocess.PIPE, text=True
        )
        assert receiver.stdout is not None
        sock = socket.create_connection(("127.0.0.1", int(receiver.stdout.readline())))
    buf = bytearray(os.urandom(PART))
    view = memoryview(buf)
    checksum = Crc32c()
    before = _cpu()
    with open(path, "rb", buffering=0) as f:
        left = size
        while left > 0:
            n = f.readinto(buf) if read else min(PART, left)
            if not n:
                break
            left -= n
            part = view[:n]
            if crc:
                checksum.update(part)
            if sock is not None:
                for i in range(0, n, BLOCK):
                    sock.sendall(part[i : i + BLOCK])
    spent = _cpu() - before
    if sock is not None and receiver is not None:
        sock.close()
        receiver.wait(timeout=60)
    return spent / (size / 1e9)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", type=int, default=6)
    ap.add_argument("--mib", type=int, default=2048, help="size of the file read and sent")
    ap.add_argument("--workdir", type=Path, default=None, help="where the file is written")
    args = ap.parse_args()
    report = Report("upload_floor")
    per: dict[str, list[float]] = {s: [] for s in STEPS}
    with tempfile.TemporaryDirectory(dir=args.workdir) as tmp:
        path = Path(tmp) / "data.bin"
        size = args.mib * MiB
        write_file(path, size, seed=1)
        one_pass(path, size, "read")  # into the page cache before the first timed pass
        for run in range(args.runs):
            for step in STEPS:
                cost = one_pass(path, size, step)
                per[step].append(cost)
                print(f"run {run + 1}: {step} {cost:.3f} CPU-s/GB", flush=True)
    report.rows = [{"step": s, "mib": args.mib, "cpu_s_per_gb": per[s]} for s in STEPS]
    rows = [
        [s, f"{statistics.median(per[s]):.3f}", f"{min(per[s]):.3f} - {max(per[s]):.3f}"]
        for s in STEPS
    ]
    report.finish(md_table(["step", "CPU-s/GB (median)", "runs (min - max)"], rows))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
