"""deploy/slurm: shellcheck, the directives, and the batch script run for real on this machine.

Slurm itself cannot run here, so ``srun`` is a stand-in for a one-node allocation: it drops its
``--options`` and ``exec``s the command, so a signal sent to "srun" reaches the task, as Slurm's
srun forwards it. Everything else is real: bash runs the batch script, the real ``ckpt-sidecar``
restores and uploads to a ``file://`` destination, and a small trainer saves a checkpoint, then
an emergency one when the notice file appears: SIGUSR1 (what ``--signal=B:USR1@120`` sends)
reaches the sidecar through the trap, and its drain writes the file. Like README.md's training
loop, the trainer installs no SIGUSR1 handler, so a SIGUSR1 sent to it would kill it.
"""

from __future__ import annotations

import json
import os
import random
import re
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.deploy.tools import DEPLOY, run, tool
from tests.servers.ports import free_port

SCRIPT = DEPLOY / "slurm" / "train-with-ckpt-sidecar.sbatch"

STAND_IN_SRUN = """#!/bin/bash
# Stand-in for srun on a one-node allocation: options are dropped, the command replaces us.
while [[ $# -gt 0 && $1 == -* ]]; do shift; done
export SLURM_NODEID=0 SLURM_PROCID=0 SLURM_LOCALID=0
exec "$@"
"""

TRAINER = r"""
import argparse, json, os, pathlib, sys, time
from sidecar.client import daemon_status, preemption_notice
p = argparse.ArgumentParser()
p.add_argument("--checkpoint-dir", type=pathlib.Path, required=True)
d = p.parse_args().checkpoint_dir

def save(step):
    tmp = d / f".step_{step}.pt.tmp"
    tmp.write_bytes(f"weights at step {step}\n".encode() * 4096)
    os.rename(tmp, d / f"step_{step}.pt")

if os.environ["TRAINER_MODE"] == "resume":
    found = sorted(x.name for x in d.iterdir() if x.name.startswith("step_"))
    status = daemon_status()  # at the admin port the script exported
    report = {
        "found": found,
        "port": os.environ["CKPT_SIDECAR_ADMIN__PORT"],
        "state": status and status.get("state"),
    }
    pathlib.Path(os.environ["TRAINER_REPORT"]).write_text(json.dumps(report))
    sys.exit(0)
save(1)
deadline = time.monotonic() + 60
while preemption_notice(d) is None:  # no SIGUSR1 handler: the notice file is the cue
    if time.monotonic() > deadline:
        sys.exit(3)
    time.sleep(0.1)
save(2)  # the emergency checkpoint
"""


def _wait_for(predicate: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout:.0f} s waiting for {what}")
        time.sleep(0.1)


def _free_port_a_job_id_gives() -> int:
    """A loopback port in 20000-29999 (what the script derives from the job id) free now."""
    for port in random.sample(range(20000, 30000), 200):
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    pytest.fail("no free port in 20000-29999")


def _group(pgid: int) -> list[int]:
    """Live processes (not zombies) in process group ``pgid``."""
    members = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if fields[0] != "Z" and int(fields[2]) == pgid:
            members.append(int(stat.parent.name))
    return members


def test_shellcheck_is_clean() -> None:
    proc = run([tool("shellcheck"), "--severity=style", str(SCRIPT)])
    assert proc.returncode == 0, proc.stdout


def test_directives_signal_the_batch_shell_before_the_grace_runs_out() -> None:
    text = SCRIPT.read_text(encoding="utf-8")
    (signal_spec,) = re.findall(r"^#SBATCH --signal=(\S+)$", text, re.M)
    target, _, lead = signal_spec.partition("@")
    assert target == "B:USR1", "only the batch shell gets it, and forwards it"
    (grace,) = re.findall(r"CKPT_SIDECAR_SHUTDOWN_GRACE_SECONDS:-(\d+)", text)
    assert int(grace) < int(lead), "the drain must end before the time limit"
    assert "#SBATCH --requeue" in text
    # srun's own options are single words (--name=value), which the stand-in below relies on.
    for line in re.findall(r"^\s*srun .*$", text, re.M):
        for word in line.split()[1:]:
            if not word.startswith("-"):
                break
            assert word.startswith("--"), f"one-word srun options only: {line}"


class _Job:
    def __init__(
        self,
        tmp: Path,
        ckpt_dir: Path,
        remote: Path,
        *,
        job_id: int = 4242,
        admin_port: int | None = None,
        **env: str,
    ) -> None:
        bin_dir = tmp / "bin"
        bin_dir.mkdir(exist_ok=True)
        srun = bin_dir / "srun"
        srun.write_text(STAND_IN_SRUN)
        srun.chmod(0o755)
        trainer = tmp / "trainer.py"
        trainer.write_text(TRAINER)
        base = {k: v for k, v in os.environ.items() if not k.startswith("CKPT_")}
        base.update(
            PATH=f"{bin_dir}:{base['PATH']}",
            SLURM_JOB_ID=str(job_id),
            SLURM_JOB_NAME="test",
            SLURM_JOB_NUM_NODES="1",
            SIDECAR_BIN=str(Path(sys.executable).parent / "ckpt-sidecar"),
            CKPT_DESTINATION_BASE=f"file://{remote}",
            CKPT_DIR=str(ckpt_dir),
            PYTHON=sys.executable,
            TRAIN_SCRIPT=str(trainer),
            CKPT_SIDECAR_PREEMPTION__SOURCE="none",
            CKPT_SIDECAR_SHUTDOWN_GRACE_SECONDS="30",
        )
        if admin_port is not None:  # else the script derives it from the job id
            base["CKPT_SIDECAR_ADMIN__PORT"] = str(admin_port)
        base.update(env)
        self.log_path = tmp / f"job-{ckpt_dir.parent.name}.log"
        self._log = self.log_path.open("wb")
        self.proc = subprocess.Popen(
            ["bash", str(SCRIPT)],
            cwd=tmp,
            env=base,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )

    def finish(self, timeout: float) -> int:
        """The batch script's exit status; afterwards no process of the job may be left."""
        try:
            status = self.proc.wait(timeout=timeout)
            _wait_for(lambda: not _group(self.proc.pid), 10, "the job's processes to exit")
            return status
        finally:
            if _group(self.proc.pid):
                os.killpg(self.proc.pid, signal.SIGKILL)
            if self.proc.poll() is None:
                self.proc.wait()
            self._log.close()

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")[-6000:]


def test_usr1_drains_the_emergency_checkpoint_and_the_next_job_restores_it(
    tmp_path: Path,
) -> None:
    remote = tmp_path / "remote"
    manifests = remote / "node-0" / ".ckpt-sidecar" / "manifests"
    first = _Job(
        tmp_path,
        tmp_path / "node-a" / "checkpoints",
        remote,
        admin_port=free_port(),
        TRAINER_MODE="train",
    )
    try:
        _wait_for(
            lambda: (manifests / "step_1.pt.json").exists() or first.proc.poll() is not None,
            60,
            "the sidecar to commit step_1.pt under node-0/",
        )
        assert first.proc.poll() is None, "the job ended before the signal"
        first.proc.send_signal(signal.SIGUSR1)  # what --signal=B:USR1@120 does
        assert first.finish(timeout=90) == 0
    except BaseException:
        first.finish(timeout=0.1)
        print(first.log())
        raise
    assert (manifests / "step_2.pt.json").exists(), first.log()

    report = tmp_path / "resumed.json"
    second_dir = tmp_path / "node-b" / "checkpoints"
    # No CKPT_SIDECAR_ADMIN__PORT: the script derives 20000 + job id % 10000, a free one here.
    port = _free_port_a_job_id_gives()
    second = _Job(
        tmp_path,
        second_dir,
        remote,
        job_id=70000 + port - 20000,
        TRAINER_MODE="resume",
        TRAINER_REPORT=str(report),
    )
    try:
        # The trainer exits at once; the sidecar is then stopped with SIGTERM.
        assert second.finish(timeout=90) == 0
    except BaseException:
        print(second.log())
        raise
    resumed = json.loads(report.read_text())
    assert "step_2.pt" in resumed["found"], second.log()
    # The readiness check and the trainer's client both reached this job's sidecar there.
    assert resumed["port"] == str(port)
    assert resumed["state"] == "running", second.log()
    expected = (tmp_path / "node-a" / "checkpoints" / "step_2.pt").read_bytes()
    assert (second_dir / "step_2.pt").read_bytes() == expected
