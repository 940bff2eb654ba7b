"""``make demo``: a training job loses its machine and finishes elsewhere, bit for bit.

Runs, in about a minute on a laptop CPU, with everything local:

1. machine A: the sidecar watches ``machine-a/`` and uploads to ``file://<workspace>/bucket``;
   the plain PyTorch example trains beside it, saving a checkpoint every 50 steps.
2. The "cloud" announces that machine A will be reclaimed in 60 s (simulated with the
   sidecar's trigger file, ``preemption.trigger_file``). The sidecar tells the trainer
   (notice file); the trainer writes an emergency checkpoint, waits until the sidecar has
   committed it, and exits. Machine A is gone.
3. machine B: ``ckpt-sidecar restore`` brings back the newest committed checkpoint into an
   empty folder; the same training script resumes from it and finishes.
4. For comparison the same job runs once more without interruption: the final weights are
   compared bit for bit.

Everything is written under ``$TMPDIR/ckpt-sidecar-demo`` (emptied at start, kept at the
end so you can look around).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
TRAIN = HERE / "pytorch_plain" / "train.py"
STEPS, SAVE_EVERY = 400, 50
T0 = time.monotonic()


def say(who: str, msg: str) -> None:
    print(f"[{time.monotonic() - T0:5.1f}s] {who:<8}| {msg}", flush=True)


def env_for_children() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("CKPT_SIDECAR_")}
    env["PYTHONWARNINGS"] = "ignore"  # keep the story readable
    return env


class Process:
    """A child whose output lines are narrated (and kept) as they come."""

    def __init__(self, who: str, cmd: list[str], env: dict[str, str], narrate: Any) -> None:
        self.who = who
        self.lines: list[str] = []
        self.proc = subprocess.Popen(
            cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
        )
        self._narrate = narrate
        self.changed = threading.Condition()
        self._thread = threading.Thread(target=self._read, daemon=True)
        self._thread.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            line = line.rstrip("\n")
            with self.changed:
                self.lines.append(line)
                self.changed.notify_all()
            self._narrate(self.who, line)
        with self.changed:
            self.changed.notify_all()

    def wait_line(self, test: Any, timeout: float) -> str:
        end = time.monotonic() + timeout
        with self.changed:
            while True:
                for line in self.lines:
                    if test(line):
                        return line
                if time.monotonic() > end or not self._thread.is_alive():
                    raise SystemExit(f"demo: {self.who} did not get there; see the lines above")
                self.changed.wait(0.5)

    def finish(self, timeout: float = 300) -> int:
        code = self.proc.wait(timeout)
        self._thread.join(5)
        return code


def trainer_line(who: str, line: str) -> None:
    say(who, line)


def only_the_end(who: str, line: str) -> None:
    if line.startswith("finished"):
        say(who, line)


def sidecar_line(who: str, line: str) -> None:
    try:
        ev = json.loads(line)
    except ValueError:
        return
    name = ev.get("event")
    if name == "daemon.ready":
        say(who, f"ready: watching {ev['watch']}, uploading to {ev['destination']}")
    elif name == "checkpoint.committed":
        say(who, f"committed {ev['checkpoint']} (step {ev['step']}): it is safe in the bucket")
    elif name == "drain.started":
        say(
            who,
            f"termination notice ({ev['source']}): {ev['seconds_left']:.0f} s left; told the "
            "trainer (notice file), uploading what is newest first",
        )
    elif name == "drain.done":
        say(who, f"drain done: {ev['outcome']}, newest commit {ev['last_committed']['name']}")
    elif name == "drain.emergency_checkpoint":
        say(who, f"the trainer's emergency checkpoint {ev['checkpoint']} appeared: it goes first")
    elif ev.get("level") == "error":
        say(who, f"error: {name} {ev}")


def is_event(name: str) -> Any:
    def test(line: str) -> bool:
        try:
            return bool(json.loads(line).get("event") == name)
        except ValueError:
            return False

    return test


def main() -> int:
    ws = Path(tempfile.gettempdir()) / "ckpt-sidecar-demo"
    shutil.rmtree(ws, ignore_errors=True)
    machine_a, machine_b, machine_c = ws / "machine-a", ws / "machine-b", ws / "machine-c"
    bucket, trigger = ws / "bucket", ws / "preempt-now"
    machine_a.mkdir(parents=True)
    env = env_for_children()
    py = sys.executable
    sidecar_cmd = [py, "-m", "sidecar"]

    print(f"ckpt-sidecar demo; everything happens under {ws}\n", flush=True)
    say("demo", "machine A: start the sidecar beside the trainer")
    daemon_env = {
        **env,
        "CKPT_SIDECAR_LOG__FORMAT": "json",
        "CKPT_SIDECAR_ADMIN__PORT": "0",
        "CKPT_SIDECAR_PREEMPTION__SOURCE": "none",
        "CKPT_SIDECAR_PREEMPTION__TRIGGER_FILE": str(trigger),
        "CKPT_SIDECAR_WATCH__SETTLE_SECONDS": "0.5",
    }
    run = [*sidecar_cmd, "run", "--watch", str(machine_a), "--destination", f"file://{bucket}"]
    daemon = Process("sidecar", run, daemon_env, sidecar_line)
    port = json.loads(daemon.wait_line(is_event("admin.listening"), 60))["port"]
    admin = f"http://127.0.0.1:{port}"
    common = ["--steps", str(STEPS), "--save-every", str(SAVE_EVERY), "--log-every", "50"]
    slow = ["--step-seconds", "0.02"]  # a real step takes longer; this one pretends to
    say("demo", f"machine A: start training ({STEPS} steps, a checkpoint every {SAVE_EVERY})")
    train_a = Process(
        "trainer",
        [py, str(TRAIN), "--dir", str(machine_a), *common, *slow, "--admin-url", admin],
        env,
        trainer_line,
    )
    daemon.wait_line(lambda s: '"checkpoint.committed"' in s and '"step": 100' in s, 120)
    train_a.wait_line(lambda s: s.startswith("step 150 "), 60)

    say("demo", "the cloud announces: machine A will be reclaimed in 60 s (simulated)")
    tmp = trigger.with_suffix(".tmp")
    tmp.write_text("60")
    tmp.replace(trigger)
    if train_a.finish() != 0:
        raise SystemExit("demo: the trainer failed; see the lines above")
    stopped = int(train_a.wait_line(lambda s: "stopping at step" in s, 5).rsplit(" ", 1)[1])
    daemon.proc.kill()  # the machine is reclaimed: nothing on it survives
    daemon.finish(60)
    say("demo", f"machine A is gone (trainer stopped at step {stopped} of {STEPS})\n")

    say("demo", "committed in the bucket (ckpt-sidecar list; retention keeps the newest 3):")
    listed = subprocess.run(
        [*sidecar_cmd, "list", "--json", "--destination", f"file://{bucket}"],
        env=env,
        capture_output=True,
        text=True,
        check=True,
    )
    for row in json.loads(listed.stdout):
        say("", f"  {row['name']:<16} step {row['step']:>4}   {row['bytes']:,} bytes")

    say("demo", "machine B: an empty folder; ckpt-sidecar restore --to machine-b")
    restored = subprocess.run(
        [*sidecar_cmd, "restore", "--destination", f"file://{bucket}", "--to", str(machine_b)],
        env=env,
        capture_output=True,
        text=True,
        check=True,
    )
    say("restore", restored.stdout.strip())
    final_b, final_c = ws / "final-b.pt", ws / "final-c.pt"
    say("demo", "machine B: the same training command resumes and finishes")
    train_b = Process(
        "trainer",
        [py, str(TRAIN), "--dir", str(machine_b), *common, "--export", str(final_b)],
        env,
        trainer_line,
    )
    if train_b.finish() != 0:
        raise SystemExit("demo: the resumed trainer failed; see the lines above")

    say("demo", "for comparison, machine C runs the whole job without any interruption")
    train_c = Process(
        "trainer",
        [py, str(TRAIN), "--dir", str(machine_c), *common, "--export", str(final_c)],
        env,
        only_the_end,
    )
    if train_c.finish() != 0:
        raise SystemExit("demo: the uninterrupted trainer failed")
    same = same_weights(final_b, final_c)
    print(flush=True)
    if same:
        say("demo", "the interrupted job and the uninterrupted one end with the same weights")
        say("demo", "and optimizer state, bit for bit. Nothing was lost but the machine.")
    else:
        say("demo", "the final weights DIFFER: please report this")
    say("demo", f"look around: {ws}")
    return 0 if same else 1


def same_weights(a: Path, b: Path) -> bool:
    import torch

    x, y = torch.load(a, weights_only=True), torch.load(b, weights_only=True)

    def equal(p: Any, q: Any) -> bool:
        if isinstance(p, torch.Tensor):
            return isinstance(q, torch.Tensor) and torch.equal(p, q)
        if isinstance(p, dict):
            return (
                isinstance(q, dict) and p.keys() == q.keys() and all(equal(p[k], q[k]) for k in p)
            )
        if isinstance(p, list | tuple):
            return len(p) == len(q) and all(equal(i, j) for i, j in zip(p, q, strict=True))
        return bool(p == q)

    return equal(x, y)


if __name__ == "__main__":
    sys.exit(main())
