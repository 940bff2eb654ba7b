"""give_back_free_memory: the free space between buffers still in use leaves memory
(measured with resident_bytes, which the uploader uses to decide when to call it)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

# A child process allocates twelve buffers of 5-8 MiB from the heap (glibc's mmap threshold
# pinned above them, as it ends up in the daemon once buffers of that size have been freed),
# frees every other one, and reports its resident memory before and after the call.
CHILD = r"""
import json
from sidecar.heap import give_back_free_memory, resident_bytes as rss

MiB = 1 << 20
start = rss()
bufs = [b"\x01" * ((5 + i % 4) * MiB) for i in range(12)]
total = sum(len(b) for b in bufs)
holes = sum(len(b) for b in bufs[::2])
del bufs[::2]
freed = rss()
asked = give_back_free_memory()
after = rss()
r = dict(start=start, freed=freed, after=after, total=total, holes=holes, asked=asked)
print(json.dumps(r))
"""


@pytest.mark.skipif(sys.platform != "linux", reason="the daemon's image is glibc Linux")
def test_free_space_between_live_buffers_leaves_resident_memory() -> None:
    env = {**os.environ, "MALLOC_MMAP_THRESHOLD_": str(32 << 20)}
    out = subprocess.run(
        [sys.executable, "-c", CHILD], env=env, capture_output=True, text=True, check=True
    )
    r = json.loads(out.stdout)
    assert r["asked"] is True
    # freeing alone keeps the holes resident (what the call is for) ...
    assert r["freed"] - r["start"] >= 0.9 * r["total"]
    # ... and the call gives most of them back
    assert r["freed"] - r["after"] >= 0.8 * r["holes"]
