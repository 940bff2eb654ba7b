"""Drain outcomes against a deadline over a capped uplink.

For each deadline and checkpoint size: the daemon runs against gcp-storage-emulator behind a
proxy that caps the uplink, a checkpoint completes, and a notice (SIGUSR1, deadline =
``shutdown_grace_seconds``) arrives at once. The target: the checkpoint is committed whenever
its bytes <= 0.8 x bandwidth x deadline. Prints a Markdown table and writes JSON beside it.

    .venv/bin/python -m bench.drain --rate-mib 2 --deadlines 30,120 --fractions 0.5,0.8,1.0,1.2
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
from datetime import UTC, datetime
from pathlib import Path

from tests.e2e.harness import Daemon, checkpoint_is
from tests.servers.faultproxy import FaultProxy
from tests.servers.gcs import start_gcp_storage_emulator, stop

MiB = 1024 * 1024


def one(url: str, proxy: FaultProxy, deadline: float, size: int, work: Path) -> dict[str, object]:
    watch = work / "w"
    watch.mkdir(parents=True)
    d = Daemon(
        watch,
        url,
        env={
            "STORAGE_EMULATOR_HOST": proxy.url,
            "CKPT_SIDECAR_DESTINATION__GCS__CHUNK_SIZE_BYTES": str(4 * MiB),
            "CKPT_SIDECAR_SHUTDOWN_GRACE_SECONDS": str(deadline),
        },
    )
    try:
        d.wait_for("daemon.ready", timeout=60)
        with open(watch / ".payload", "wb") as f:
            for _ in range(size // MiB):
                f.write(os.urandom(MiB))
        os.replace(watch / ".payload", watch / "step_1.pt")
        d.wait_for("checkpoint.ready", where=checkpoint_is("step_1.pt"))
        d.proc.send_signal(10)  # SIGUSR1: drain, deadline = now + shutdown_grace_seconds
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
    p = argparse.ArgumentParser()
    p.add_argument("--rate-mib", type=float, default=2.0)
    p.add_argument("--deadlines", default="30,120")
    p.add_argument("--fractions", default="0.5,0.8,1.0,1.2")
    a = p.parse_args()
    rate = int(a.rate_mib * MiB)
    rows = []
    with tempfile.TemporaryDirectory(prefix="bench-drain-") as tmp:
        server = start_gcp_storage_emulator(Path(tmp))
        host, port = server.url.removeprefix("http://").split(":")
        proxy = FaultProxy(host, int(port))
        proxy.set(rate=rate)
        try:
            for deadline in (float(x) for x in a.deadlines.split(",")):
                for frac in (float(x) for x in a.fractions.split(",")):
                    size = int(frac * rate * deadline) // MiB * MiB
                    bucket = server.new_bucket("drain")
                    work = Path(tmp) / f"{deadline}-{frac}"
                    r = one(f"gs://{bucket}/run", proxy, deadline, size, work)
                    expected = "committed" if frac <= 0.8 else "either"
                    rows.append(
                        {
                            "deadline_s": deadline,
                            "size_mib": size // MiB,
                            "fraction_of_bw_x_deadline": frac,
                            **r,
                            "expected": expected,
                        }
                    )
                    print(rows[-1], flush=True)
        finally:
            proxy.close()
            stop(server)
    print(f"\nuplink {a.rate_mib} MiB/s, {datetime.now(UTC):%Y-%m-%d %H:%M} UTC\n")
    print(
        "| deadline s | size MiB | size / (bw x deadline) | outcome | drain s | margin s | target |"
    )
    print("|---:|---:|---:|---|---:|---:|---|")
    for r in rows:
        print(
            f"| {r['deadline_s']:.0f} | {r['size_mib']} | {r['fraction_of_bw_x_deadline']} | "
            f"{r['outcome']} | {r['seconds']} | {r['margin']} | {r['expected']} |"
        )
    Path(__file__).with_name("drain.json").write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
