"""POST endpoints from a non-loopback peer: refused without the token, accepted with it."""

from __future__ import annotations

import sys
from pathlib import Path

from tests.e2e.harness import Daemon
from tests.servers.netns import PeerHost, test_host  # noqa: F401 - fixture

TOKEN = "tkn-a81b-never-logged"
_CLIENT = """
import sys, urllib.request, urllib.error
url, method, token = sys.argv[1], sys.argv[2], sys.argv[3]
req = urllib.request.Request(url, data=b"" if method == "POST" else None, method=method)
if token:
    req.add_header("Authorization", "Bearer " + token)
try:
    with urllib.request.urlopen(req, timeout=10) as r:
        print(r.status)
except urllib.error.HTTPError as e:
    print(e.code)
"""


def _call(host: PeerHost, url: str, method: str, token: str = "") -> int:
    r = host.run(sys.executable, "-c", _CLIENT, url, method, token)
    assert r.returncode == 0, r.stderr
    return int(r.stdout.strip())


def test_post_from_another_host_needs_the_token(
    dirs: tuple[Path, Path],
    daemons: list[Daemon],
    test_host: PeerHost,  # noqa: F811
) -> None:
    watch, remote = dirs
    d = Daemon(
        watch,
        f"file://{remote}",
        env={
            "CKPT_SIDECAR_ADMIN__HOST": "0.0.0.0",
            "CKPT_SIDECAR_ADMIN__TOKEN": TOKEN,
        },
    )
    daemons.append(d)
    d.wait_for("daemon.ready")
    base = f"http://{test_host.host_ip}:{d.admin_port}"
    assert _call(test_host, f"{base}/metrics", "GET") == 200  # read-only: anyone reaching it
    assert _call(test_host, f"{base}/v1/flush", "POST") == 403
    assert _call(test_host, f"{base}/v1/flush", "POST", "wrong-token") == 403
    forbidden = d.wait_for("admin.forbidden")
    assert forbidden["peer"] == test_host.peer_ip
    assert _call(test_host, f"{base}/v1/flush", "POST", TOKEN) == 202
    assert d.terminate() == 0
    assert not any(TOKEN in line for line in d.raw)
