"""Downloads over connections of limited speed: in parallel ranges (the default) against one
stream, on S3, GCS and Azure.

Against a real store one connection is the limit (S3 gives one about 85-90 MB/s); a local
server on loopback has none. Here a proxy between the backend and the local server holds
each connection's server-to-client bytes to ``--cap-mbps`` MB/s (a token bucket of 50 ms per
connection, in this process, two threads per connection), and one object of ``--mib`` MiB
(random bytes, uploaded through the proxy first) is downloaded in this process with the
backend's ``get_file``, ``--runs`` times each way, the two ways in turn:

* ``ranges``: the backend with default settings (S3 and GCS ranges of 8 MiB, Azure 4 MiB,
  six at once);
* ``one stream``: the same backend with its range size above the object's size (S3
  ``part_size_bytes``, GCS ``xml_part_size_bytes``; Azure by raising
  ``sidecar.storage.azure.DOWNLOAD_GET_BYTES`` in this process, which leaves the SDK's
  4 MiB GETs one after another, the download before 2b2a2eb).

Printed per store and way: MB/s (10^6 bytes per wall second; median and each run) and this
process's CPU seconds per GB (user + system, the proxy's threads included). Every download
is checked against the source's CRC32C. GCS runs on fake-gcs-server, which names an
object's generation in its reply as GCS does (gcp-storage-emulator does not, and gets one
stream either way).

    .venv/bin/python -m bench.ranged_download --backends s3,gcs,azure --runs 2
"""

from __future__ import annotations

import argparse
import contextlib
import os
import resource
import shutil
import socket
import statistics
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from unittest import mock

from bench._common import MiB, Report, md_table, s3_env, store, write_file
from sidecar.config import DestinationConfig
from sidecar.storage import azure
from sidecar.storage.base import Backend
from sidecar.storage.checksum import crc32c_of_file
from sidecar.storage.options import AzureOptions, GcsOptions, S3Options
from sidecar.storage.registry import open_backend
from tests.servers.azurite import ACCOUNT, KEY, Azurite
from tests.servers.gcs import GcsServer
from tests.servers.seaweedfs import S3Server, new_bucket

WAYS = ("ranges", "one stream")
ONE_STREAM = 5 * 1024 * MiB  # a range size above any object here
BURST_SECONDS = 0.05


def _relay(src: socket.socket, dst: socket.socket, rate: float) -> None:
    """Copy ``src`` to ``dst`` until either closes; at most ``rate`` bytes/s when ``rate``."""
    tokens, last = 0.0, time.monotonic()
    try:
        while data := src.recv(65536):
            if rate:
                now = time.monotonic()
                tokens = min(rate * BURST_SECONDS, tokens + rate * (now - last)) - len(data)
                last = now
                if tokens < 0:
                    time.sleep(-tokens / rate)  # the cap itself: this is what it measures
            dst.sendall(data)
    except OSError:
        pass
    finally:
        for s in (src, dst):
            with contextlib.suppress(OSError):
                s.shutdown(socket.SHUT_RDWR)


@contextlib.contextmanager
def capping_proxy(upstream_port: int, mbps: float) -> Iterator[str]:
    """``http://127.0.0.1:PORT`` of a TCP proxy to ``upstream_port`` whose replies go at
    most ``mbps`` MB/s per connection."""
    listener = socket.create_server(("127.0.0.1", 0))
    listener.settimeout(0.2)
    stop = threading.Event()

    def serve() -> None:
        while not stop.is_set():
            try:
                client, _ = listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            upstream = socket.create_connection(("127.0.0.1", upstream_port))
            for a, b, rate in ((client, upstream, 0.0), (upstream, client, mbps * 1e6)):
                threading.Thread(target=_relay, args=(a, b, rate), daemon=True).start()

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{listener.getsockname()[1]}"
    finally:
        stop.set()
        thread.join(5)
        listener.close()


def backend_for(kind: str, server: Any, bucket: str, proxy: str, way: str) -> Backend:
    """A backend on ``bucket`` (a container on Azure) of ``server``, reached through
    ``proxy``, set up for ``way``."""
    span = ONE_STREAM if way == "one stream" else None
    if kind == "s3":
        assert isinstance(server, S3Server)
        os.environ.update(s3_env(server, endpoint=proxy))
        opts = S3Options(part_size_bytes=span) if span else S3Options()
        return open_backend(DestinationConfig(url=f"s3://{bucket}/bench", s3=opts))
    if kind == "gcs":
        assert isinstance(server, GcsServer)
        os.environ["STORAGE_EMULATOR_HOST"] = proxy
        gcs = GcsOptions(xml_part_size_bytes=span) if span else GcsOptions()
        return open_backend(DestinationConfig(url=f"gs://{bucket}/bench", gcs=gcs))
    assert isinstance(server, Azurite)
    az = AzureOptions.model_validate({"account_url": f"{proxy}/{ACCOUNT}", "account_key": KEY})
    return open_backend(DestinationConfig(url=f"az://{bucket}/bench", azure=az))


def _cpu() -> float:
    ru = resource.getrusage(resource.RUSAGE_SELF)
    return ru.ru_utime + ru.ru_stime


def one_download(kind: str, backend: Backend, way: str, dest: Path) -> tuple[float, float]:
    """Wall and CPU seconds of one ``get_file`` of ``bench/obj``."""
    azure_one = way == "one stream" and kind == "azure"
    patch = mock.patch.object(azure, "DOWNLOAD_GET_BYTES", ONE_STREAM) if azure_one else None
    with patch or contextlib.nullcontext():
        cpu, start = _cpu(), time.perf_counter()
        backend.get_file("obj", dest)
        return time.perf_counter() - start, _cpu() - cpu


def run_store(kind: str, args: argparse.Namespace, src: Path, work: Path) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    with store(kind, "fake-gcs-server") as server:
        assert server is not None
        if isinstance(server, S3Server):
            bucket = new_bucket(server, "ranged")
            port = int(server.endpoint_url.rsplit(":", 1)[1])
        elif isinstance(server, GcsServer):
            bucket = server.new_bucket("ranged")
            port = int(server.url.rsplit(":", 1)[1])
        else:
            bucket = server.new_container()
            port = server.port
        with capping_proxy(port, args.cap_mbps) as proxy:
            backends = {way: backend_for(kind, server, bucket, proxy, way) for way in WAYS}
            backends["ranges"].put_file("obj", src)
            want = crc32c_of_file(src)
            for run in range(args.runs):
                for way in WAYS if run % 2 == 0 else reversed(WAYS):
                    dest = work / "back.bin"
                    wall, cpu = one_download(kind, backends[way], way, dest)
                    if crc32c_of_file(dest) != want:
                        raise RuntimeError(f"{kind} {way}: the download differs from the source")
                    dest.unlink()
                    size = src.stat().st_size
                    row = {
                        "store": kind,
                        "way": way,
                        "run": run + 1,
                        "mb_per_s": round(size / 1e6 / wall, 1),
                        "cpu_s_per_gb": round(cpu / (size / 1e9), 2),
                    }
                    print(row, flush=True)
                    rows.append(row)
            for b in backends.values():
                b.close()
    return rows


def table(rows: list[dict[str, Any]]) -> str:
    out = []
    for kind in dict.fromkeys(r["store"] for r in rows):
        for way in WAYS:
            mine = [r for r in rows if r["store"] == kind and r["way"] == way]
            speeds = [r["mb_per_s"] for r in mine]
            out.append(
                [
                    kind,
                    way,
                    f"{statistics.median(speeds):.0f}",
                    " / ".join(f"{s:.0f}" for s in speeds),
                    f"{statistics.median(r['cpu_s_per_gb'] for r in mine):.2f}",
                ]
            )
    return md_table(["store", "download", "MB/s (median)", "MB/s each run", "CPU-s/GB"], out, 2)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--backends", default="s3,gcs,azure", help="of s3, gcs, azure")
    p.add_argument("--runs", type=int, default=2)
    p.add_argument("--mib", type=int, default=512, help="the object's size")
    p.add_argument("--cap-mbps", type=float, default=50.0, help="per connection, replies")
    args = p.parse_args()
    report = Report("ranged_download")
    work = Path(tempfile.mkdtemp(prefix="ranged-"))
    try:
        src = work / "obj.bin"
        write_file(src, args.mib * MiB, seed=5)
        rows = [r for kind in args.backends.split(",") for r in run_store(kind, args, src, work)]
    finally:
        shutil.rmtree(work, ignore_errors=True)
    report.rows = rows
    cap = f"Each connection's replies held to {args.cap_mbps:g} MB/s; one object of {args.mib} MiB."
    report.finish(cap + "\n\n" + table(rows))


if __name__ == "__main__":
    main()
