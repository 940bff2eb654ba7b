"""A second test host: a network namespace joined to this one by a veth pair.

Used to reach the admin listener from a non-loopback peer. Needs root and iproute2; a
machine without them fails the test that asks for it (never a skip).
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass

import pytest


@dataclass(frozen=True)
class PeerHost:
    name: str
    host_ip: str  # this machine's end of the link
    peer_ip: str  # the namespace's end

    def run(self, *cmd: str, timeout: float = 30) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            ["ip", "netns", "exec", self.name, *cmd],
            capture_output=True,
            text=True,
            timeout=timeout,
        )


def _ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True, text=True, timeout=10)


@pytest.fixture
def test_host() -> Iterator[PeerHost]:
    if os.geteuid() != 0 or shutil.which("ip") is None:
        pytest.fail("this test needs root and iproute2 (`ip`) to make a network namespace")
    tag = f"{os.getpid() % 100000}"
    ns, host_if, ns_if = f"ckpt-{tag}", f"vh{tag}", f"vn{tag}"
    third = 10 + os.getpid() % 200
    host_ip, peer_ip = f"10.231.{third}.1", f"10.231.{third}.2"
    _ip("netns", "add", ns)
    try:
        _ip("link", "add", host_if, "type", "veth", "peer", "name", ns_if)
        _ip("link", "set", ns_if, "netns", ns)
        _ip("addr", "add", f"{host_ip}/30", "dev", host_if)
        _ip("link", "set", host_if, "up")
        _ip("netns", "exec", ns, "ip", "addr", "add", f"{peer_ip}/30", "dev", ns_if)
        _ip("netns", "exec", ns, "ip", "link", "set", ns_if, "up")
        _ip("netns", "exec", ns, "ip", "link", "set", "lo", "up")
        yield PeerHost(ns, host_ip, peer_ip)
    finally:
        subprocess.run(["ip", "netns", "del", ns], capture_output=True, timeout=10)
        subprocess.run(["ip", "link", "del", host_if], capture_output=True, timeout=10)
