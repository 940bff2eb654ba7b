"""Drain outcomes against a deadline over a capped uplink, per destination.

For each destination, deadline and checkpoint size: the daemon (default settings) runs against
a local store (gcp-storage-emulator, SeaweedFS or Azurite) behind a proxy that caps the uplink
for all connections together, a one-file checkpoint completes, and a notice (SIGUSR1,
deadline = ``shutdown_grace_seconds``) arrives at once. The target: the checkpoint is committed
whenever its bytes <= 0.8 x bandwidth x deadline. A ``committed`` outcome is checked in the
store: its manifest is read back and names one object of the checkpoint's size, which exists
with that size. Prints a Markdown table and writes ``bench/drain.json`` (a run of some
destinations keeps the other destinations' rows of earlier runs).

    .venv/bin/python -m bench.drain --backends gcs,s3,azure --rate-mib 2 --deadlines 30,120
"""

from __future__ import annotations

import argparse
import os
import signal
import tempfile
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from bench._common import (
    MiB,
    Report,
    Store,
    Target,
    md_table,
    new_target,
    s3_env,
    store,
    store_label,
)
from sidecar.manifest import MANIFEST_PREFIX, parse
from tests.e2e.harness import Daemon, checkpoint_is
from tests.servers.azurite import Azurite
from tests.servers.faultproxy import FaultProxy
from tests.servers.gcs import GcsServer
from tests.servers.seaweedfs import S3Server


def store_address(server: Store) -> tuple[str, int]:
    """Host and port the proxy forwards to."""
    if isinstance(server, Azurite):
        return "127.0.0.1", server.port
    assert isinstance(server, S3Server | GcsServer)
    u = urlsplit(server.endpoint_url if isinstance(server, S3Server) else server.url)
    assert u.hostname and u.port
    return u.hostname, u.port


def through_proxy(t: Target, server: Store, proxy: FaultProxy) -> dict[str, str]:
    """The daemon's environment for ``t`` with every request sent through ``proxy``."""
    if isinstance(server, GcsServer):
        return {**t.env, "STORAGE_EMULATOR_HOST": proxy.url}
    if isinstance(server, S3Server):
        return s3_env(server, endpoint=proxy.url)
    assert isinstance(server, Azurite)
    account = urlsplit(server.account_url).path
    return {**t.env, "CKPT_SIDECAR_DESTINATION__AZURE__ACCOUNT_URL": proxy.url + account}


def committed_in_store(t: Target, size: int) -> str:
    """'yes' when the store holds one manifest naming one object of ``size`` bytes that
    exists with that size; otherwise what is wrong."""
    backend = t.backend()
    try:
        keys = [o.key for o in backend.list(MANIFEST_PREFIX)]
        if len(keys) != 1:
            return f"{len(keys)} manifests"
        m = parse(backend.get_bytes(keys[0]), keys[0])
        if len(m.files) != 1 or m.files[0].size != size:
            return f"manifest names {[(f.key, f.size) for f in m.files]}"
        stored = backend.head(m.files[0].key).size
        return "yes" if stored == size else f"object holds {stored} bytes"
    finally:
        backend.close()


def one(env: dict[str, str], t: Target, deadline: float, size: int, work: Path) -> dict[str, Any]:
    watch = work / "w"
    watch.mkdir(parents=True)
    d = Daemon(watch, t.url, env={**env, "CKPT_SIDECAR_SHUTDOWN_GRACE_SECONDS": str(deadline)})
    try:
        d.wait_for("daemon.ready", timeout=60)
        with open(watch / ".payload", "wb") as f:
            for _ in range(size // MiB):
                f.write(os.urandom(MiB))
        os.replace(watch / ".payload", watch / "step_1.pt")
        d.wait_for("checkpoint.ready", where=checkpoint_is("step_1.pt"))
        d.proc.send_signal(signal.SIGUSR1)  # drain; deadline = now + shutdown_grace_seconds
        done = d.wait_for("drain.done", timeout=deadline + 30)
        return {
            "outcome": done["outcome"],
            "seconds": done["seconds"],
            "margin": done["margin_seconds"],
        }
    finally:
        d.kill()
        d.close()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--backends", default="gcs,s3,azure")
    p.add_argument("--rate-mib", type=float, default=2.0)
    p.add_argument("--deadlines", default="30,120")
    p.add_argument("--fractions", default="0.5,0.8,1.0,1.2")
    a = p.parse_args()
    rate = int(a.rate_mib * MiB)
    report = Report("drain")
    for kind in a.backends.split(","):
        emulator = "gcp-storage-emulator"  # in memory: a full run leaves about 1 GiB in it
        with (
            store(kind, emulator) as server,
            tempfile.TemporaryDirectory(prefix="bench-drain-") as tmp,
        ):
            proxy = FaultProxy(*store_address(server))
            proxy.set(rate=rate)
            try:
                for deadline in (float(x) for x in a.deadlines.split(",")):
                    for frac in (float(x) for x in a.fractions.split(",")):
                        size = int(frac * rate * deadline) // MiB * MiB
                        work = Path(tmp) / f"{deadline}-{frac}"
                        # Each case gets its own bucket or container, left in place: the
                        # store and its folder go at the end of the destination's cases.
                        t = new_target(kind, work.parent, server, "drain")
                        r = one(through_proxy(t, server, proxy), t, deadline, size, work)
                        ok = r["outcome"] == "committed"
                        in_store = committed_in_store(t, size) if ok else "-"
                        report.rows.append(
                            {
                                "destination": store_label(kind, server),
                                "deadline_s": deadline,
                                "size_mib": size // MiB,
                                "fraction": frac,
                                **r,
                                "in_store": in_store,
                                "expected": "committed" if frac <= 0.8 else "either",
                            }
                        )
                        print(report.rows[-1], flush=True)
            finally:
                proxy.close()
    table = md_table(
        [
            "destination",
            "deadline s",
            "size MiB",
            "size / (bw x deadline)",
            "outcome",
            "in the store",
            "drain s",
            "margin s",
            "target",
        ],
        [
            [
                r["destination"],
                f"{r['deadline_s']:.0f}",
                r["size_mib"],
                r["fraction"],
                r["outcome"],
                r["in_store"],
                r["seconds"],
                r["margin"],
                r["expected"],
            ]
            for r in report.rows
        ],
    )
    print(f"\nuplink {a.rate_mib} MiB/s for all connections together")
    report.finish(
        table,
        extra={"rate_mib": a.rate_mib},
        merge_on=("destination", "deadline_s", "fraction"),
    )


if __name__ == "__main__":
    main()
