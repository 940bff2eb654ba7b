"""The examples resume exactly where they stopped, through the daemon and ``restore``.

``test_sigkill_then_spot_notice_resumes_bit_exact`` (plain and DCP, ``file://``) is one
training job that loses two machines on its way to the end:

1. machine A: the trainer runs beside the daemon; at a random step both are SIGKILLed (a
   machine gone without warning). ``verify --all`` finds every commit whole and intact.
2. machine B: ``ckpt-sidecar restore`` into an empty folder brings back the newest regular
   checkpoint; the trainer resumes from it beside a new daemon; at a random later step the
   (fake) EC2 metadata service announces a spot interruption. The trainer sees the notice
   file, writes an emergency checkpoint, waits until the daemon reports it committed and
   exits 0; then the machine is gone.
3. machine C: restore into an empty folder brings back the emergency checkpoint; the
   trainer resumes from it and finishes.

``test_s3_spot_notice_emergency_checkpoint_comes_back_byte_exact`` runs the DCP example's
spot-notice machine against SeaweedFS (``s3://``) and restores the emergency checkpoint byte
for byte (resuming from restored bytes is what the ``file://`` tests prove bit-exact).

The final model and optimizer state must equal, bit for bit (``torch.equal``), those of an
uninterrupted run with the same seed.
"""

from __future__ import annotations

import contextlib
import random
import re
import signal
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from tests.e2e.harness import Daemon, checkpoint_is, same_tree
from tests.examples.conftest import SAVE_EVERY, SEED, STEPS, References
from tests.examples.trainer import (
    EXAMPLES,
    Example,
    Trainer,
    assert_same_state,
    load_export,
    restore,
    verify_all,
)
from tests.servers.ports import free_port
from tests.servers.seaweedfs import S3Server, new_bucket

if TYPE_CHECKING:
    from tests.servers.metadata_aws import FakeAwsMetadata

PACE = "0.01"  # seconds per step while the daemon runs, so that a random step can be hit


@dataclass(frozen=True)
class Destination:
    url: str
    env: dict[str, str]


def _file(tmp_path: Path) -> Destination:
    return Destination(f"file://{tmp_path / 'remote'}", {})


def _s3(server: S3Server) -> Destination:
    bucket = new_bucket(server, "examples")
    env = {
        "CKPT_SIDECAR_DESTINATION__S3__ENDPOINT_URL": server.endpoint_url,
        "CKPT_SIDECAR_DESTINATION__S3__REGION": server.region,
        "CKPT_SIDECAR_DESTINATION__S3__ADDRESSING_STYLE": "path",
    }
    return Destination(f"s3://{bucket}/run-1/node-0", env)


@contextlib.contextmanager
def _explained(run: Trainer, d: Daemon, watch: Path) -> Iterator[None]:
    """A failed wait says what the trainer printed, what the daemon logged, and what is on
    the machine's disk."""
    try:
        yield
    except AssertionError as e:
        files = sorted(
            f"{p.relative_to(watch)} {p.stat().st_size}" for p in watch.rglob("*") if p.is_file()
        )
        raise AssertionError(
            f"{e}\n--- trainer:\n{run.output()[-3000:]}\n--- daemon log tail:\n"
            + "".join(d.raw[-40:])
            + "--- files:\n"
            + "\n".join(files)
        ) from None


def _args(*extra: str) -> list[str]:
    return ["--steps", str(STEPS), "--save-every", str(SAVE_EVERY), "--seed", str(SEED), *extra]


@dataclass
class Job:
    """One training job of an example against one destination, machine after machine."""

    ex: Example
    dest: Destination
    root: Path
    rng: random.Random
    daemons: list[Daemon]
    trainers: list[Trainer]
    aws: FakeAwsMetadata

    def daemon(self, watch: Path, **env: str) -> Daemon:
        full = {**self.dest.env, "CKPT_SIDECAR_CHECKPOINT__LAYOUT": self.ex.layout, **env}
        d = Daemon(watch, self.dest.url, env=full)
        self.daemons.append(d)
        return d

    def trainer(self, folder: Path, *extra: str) -> Trainer:
        t = Trainer(self.ex, folder, *_args(*extra))
        self.trainers.append(t)
        return t

    def restored(self, machine: str, step: int, written_on: str) -> Path:
        """``ckpt-sidecar restore`` into an empty folder: it must bring back ``step``, byte
        for byte as the trainer wrote it on the machine ``written_on``."""
        folder = self.root / machine
        out = restore(self.dest.url, folder, self.dest.env)
        entry = self.ex.entry(step)
        assert f"restored {entry} (step {step}," in out, out
        assert same_tree(self.root / written_on / entry, folder / entry)
        return folder

    def sigkill_at_random_step(self, machine: str) -> int:
        """Train beside the daemon from scratch; SIGKILL both at a random step after the
        first commit. The newest committed step."""
        kill_at = self.rng.randint(SAVE_EVERY + 1, 3 * SAVE_EVERY)
        watch = self.root / machine
        watch.mkdir()
        d = self.daemon(watch)
        run = self.trainer(watch, "--step-seconds", PACE, "--log-every", "1")
        with _explained(run, d, watch):
            d.wait_for("checkpoint.committed", timeout=120)
            run.wait_for_step(kill_at)
        kills: list[Callable[[], None]] = [run.kill, d.kill]
        self.rng.shuffle(kills)
        for kill in kills:
            kill()
        reached = run.last_step()
        # Killed mid-upload: every commit is whole and intact (size and CRC32C of each object).
        names = re.findall(r"^ok +(\S+) ", verify_all(self.dest.url, self.dest.env), re.M)
        committed = max(int(re.findall(r"\d+", n)[-1]) for n in names)
        assert SAVE_EVERY <= committed <= reached < STEPS and committed % SAVE_EVERY == 0
        return committed

    def spot_notice_at_random_step(self, watch: Path, after: int) -> int:
        """Train beside a daemon that polls the fake EC2 metadata service; interrupt at a
        random step. The step of the emergency checkpoint, committed when this returns."""
        port = free_port()  # known before the daemon is up: both start at once
        d = self.daemon(
            watch,
            CKPT_SIDECAR_PREEMPTION__SOURCE="aws",
            AWS_EC2_METADATA_SERVICE_ENDPOINT=self.aws.url,
            CKPT_SIDECAR_ADMIN__PORT=str(port),
        )
        admin = f"http://127.0.0.1:{port}"
        run = self.trainer(watch, "--step-seconds", PACE, "--log-every", "1", "--admin-url", admin)
        with _explained(run, d, watch):
            if after:
                run.wait_for(f"resumed from {self.ex.entry(after)} at step {after}$", 120)
            notice_at = after + self.rng.randint(1, 2 * SAVE_EVERY)
            run.wait_for_step(notice_at)
            assert d.admin_port == port
            self.aws.interrupt("terminate", at=datetime.now(UTC) + timedelta(seconds=120))
            stopped = int(
                run.wait_for(r"preemption notice from aws \(terminate\).* at step (\d+)")[1]
            )
            out = run.finish(timeout=90)
        assert notice_at <= stopped < STEPS, out
        entry = self.ex.entry(stopped)
        if stopped % SAVE_EVERY:
            assert f"saved emergency checkpoint {entry}" in out, out
        assert f"{entry} is durable" in out, out
        d.wait_for("checkpoint.committed", where=checkpoint_is(entry))
        d.kill()  # the machine is reclaimed at the deadline
        return stopped

    def finish_and_compare(
        self, machine: str, step: int, written_on: str, references: References
    ) -> None:
        """Restore ``step`` on a new machine, resume, finish; bit-exact with the reference."""
        watch = self.restored(machine, step, written_on)
        final = self.root / "final.pt"
        out = self.trainer(watch, "--export", str(final)).finish()
        assert f"resumed from {self.ex.entry(step)} at step {step}" in out, out
        assert f"finished {STEPS} steps" in out, out
        assert_same_state(load_export(final), load_export(references.final(self.ex.name)))


@pytest.fixture
def job_parts(
    tmp_path: Path,
    daemons: list[Daemon],
    trainers: list[Trainer],
    aws_metadata: FakeAwsMetadata,
) -> dict[str, object]:
    seed = random.randrange(2**32)
    print(f"random seed for this test: {seed}")  # shown with a failure
    return {
        "root": tmp_path,
        "rng": random.Random(seed),
        "daemons": daemons,
        "trainers": trainers,
        "aws": aws_metadata,
    }


@pytest.mark.slow
@pytest.mark.parametrize("name", ["plain", "dcp"])
def test_sigkill_then_spot_notice_resumes_bit_exact(
    name: str, tmp_path: Path, references: References, job_parts: dict[str, Any]
) -> None:
    references.start(name)
    job = Job(EXAMPLES[name], _file(tmp_path), **job_parts)
    committed = job.sigkill_at_random_step("machine-a")
    watch = job.restored("machine-b", committed, written_on="machine-a")
    stopped = job.spot_notice_at_random_step(watch, committed)
    job.finish_and_compare("machine-c", stopped, "machine-b", references)


def test_s3_spot_notice_emergency_checkpoint_comes_back_byte_exact(
    s3_env: S3Server, tmp_path: Path, job_parts: dict[str, Any]
) -> None:
    job = Job(EXAMPLES["dcp"], _s3(s3_env), **job_parts)
    watch = tmp_path / "machine-a"
    watch.mkdir()
    stopped = job.spot_notice_at_random_step(watch, 0)
    job.restored("machine-b", stopped, written_on="machine-a")


@pytest.mark.slow
def test_s3_sigkill_then_spot_notice_resumes_bit_exact(
    s3_env: S3Server, tmp_path: Path, references: References, job_parts: dict[str, Any]
) -> None:
    """The whole story of the plain example on an s3:// destination (SeaweedFS)."""
    references.start("plain")
    job = Job(EXAMPLES["plain"], _s3(s3_env), **job_parts)
    committed = job.sigkill_at_random_step("machine-a")
    watch = job.restored("machine-b", committed, written_on="machine-a")
    stopped = job.spot_notice_at_random_step(watch, committed)
    job.finish_and_compare("machine-c", stopped, "machine-b", references)


def test_sigterm_to_the_trainer_saves_waits_for_durable_and_exits_0(
    tmp_path: Path, job_parts: dict[str, Any]
) -> None:
    """Kubernetes (native sidecars) and systemd stop the trainer first, with SIGTERM, while
    the sidecar runs on: the example takes it for a notice (Python's default would end it
    at once), writes an emergency checkpoint, waits until it is committed and exits 0."""
    job = Job(EXAMPLES["plain"], _file(tmp_path), **job_parts)
    watch = tmp_path / "machine-a"
    watch.mkdir()
    port = free_port()
    d = job.daemon(watch, CKPT_SIDECAR_ADMIN__PORT=str(port))
    admin = f"http://127.0.0.1:{port}"
    run = job.trainer(watch, "--step-seconds", PACE, "--log-every", "1", "--admin-url", admin)
    with _explained(run, d, watch):
        d.wait_for("daemon.ready", timeout=60)
        run.wait_for_step(SAVE_EVERY + 3)
        run.proc.send_signal(signal.SIGTERM)
        stopped = int(run.wait_for(r"preemption SIGTERM: .* at step (\d+)")[1])
        out = run.finish(timeout=90)
    entry = job.ex.entry(stopped)
    if stopped % SAVE_EVERY:  # at a regular save's step, that save is the checkpoint
        assert f"saved emergency checkpoint {entry}" in out, out
    assert f"{entry} is durable" in out, out
    d.wait_for("checkpoint.committed", where=checkpoint_is(entry))
