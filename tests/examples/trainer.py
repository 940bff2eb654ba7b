"""The example trainers as subprocesses, ``ckpt-sidecar restore``, and weight comparison."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]


@dataclass(frozen=True)
class Example:
    """One example script and the sidecar layout it writes."""

    name: str
    script: Path
    layout: str

    def entry(self, step: int) -> str:
        """The checkpoint entry the example writes for ``step``."""
        return f"step_{step:06d}" + (".pt" if self.layout == "plain" else "")


EXAMPLES = {
    "plain": Example("plain", REPO / "examples/pytorch_plain/train.py", "plain"),
    "dcp": Example("dcp", REPO / "examples/pytorch_dcp/train.py", "torch-dcp"),
}


def clean_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("CKPT_SIDECAR_")}
    env.update(extra or {})
    return env


class Trainer:
    """One run of an example; its stdout lines are collected as they come."""

    def __init__(self, example: Example, directory: Path, *args: str) -> None:
        cmd = [sys.executable, str(example.script), "--dir", str(directory), *args]
        self.proc = subprocess.Popen(
            cmd,
            env=clean_env(),
            cwd=REPO,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        self.lines: list[str] = []
        self._cond = threading.Condition()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            with self._cond:
                self.lines.append(line.rstrip("\n"))
                self._cond.notify_all()
        with self._cond:
            self._cond.notify_all()

    def wait_for(self, pattern: str, timeout: float = 60.0) -> re.Match[str]:
        """The first output line matching ``pattern``; AssertionError on timeout or exit."""
        rx = re.compile(pattern)
        end = time.monotonic() + timeout
        with self._cond:
            while True:
                for line in self.lines:
                    m = rx.search(line)
                    if m:
                        return m
                left = end - time.monotonic()
                if left <= 0 or not self._reader.is_alive():
                    raise AssertionError(f"no line matching {pattern!r}:\n" + self.output())
                self._cond.wait(min(left, 0.5))

    def wait_for_step(self, step: int, timeout: float = 60.0) -> int:
        """Wait until the trainer logged a step >= ``step``; the step it logged."""
        end = time.monotonic() + timeout
        with self._cond:
            while True:
                steps = [int(m.group(1)) for m in map(_STEP.match, self.lines) if m]
                if steps and steps[-1] >= step:
                    return steps[-1]
                left = end - time.monotonic()
                if left <= 0 or not self._reader.is_alive():
                    raise AssertionError(f"never reached step {step}:\n" + self.output())
                self._cond.wait(min(left, 0.5))

    def last_step(self) -> int:
        with self._cond:
            steps = [int(m.group(1)) for m in map(_STEP.match, self.lines) if m]
        return steps[-1] if steps else 0

    def finish(self, timeout: float = 120.0) -> str:
        """Wait for exit 0; the whole output."""
        code = self.proc.wait(timeout)
        self._reader.join(5)
        assert code == 0, f"trainer exited {code}:\n{self.output()}"
        return self.output()

    def output(self) -> str:
        with self._cond:
            return "\n".join(self.lines)

    def kill(self) -> None:
        self.proc.kill()
        self.proc.wait(10)

    def close(self) -> None:
        if self.proc.poll() is None:
            self.kill()
        self._reader.join(5)
        if self.proc.stdout is not None:
            self.proc.stdout.close()


_STEP = re.compile(r"step (\d+) loss ")


def sidecar_cli(*args: str, env: dict[str, str] | None = None) -> str:
    """``ckpt-sidecar <args>``; its stdout (asserts exit 0)."""
    r = subprocess.run(
        [sys.executable, "-m", "sidecar", *args],
        env=clean_env(env),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 0, f"ckpt-sidecar {' '.join(args)} exited {r.returncode}: {r.stderr}"
    return r.stdout


def restore(destination: str, target: Path, env: dict[str, str] | None = None) -> str:
    """``ckpt-sidecar restore --to target``; its stdout (asserts exit 0)."""
    return sidecar_cli("restore", "--destination", destination, "--to", str(target), env=env)


def verify_all(destination: str, env: dict[str, str] | None = None) -> str:
    """``ckpt-sidecar verify --all``: every committed object is there, size and CRC32C."""
    return sidecar_cli("verify", "--all", "--destination", destination, env=env)


def assert_same_state(a: Any, b: Any, where: str = "state") -> None:
    """Equal nested state dicts: tensors bit for bit (``torch.equal``), the rest by ``==``."""
    import torch

    if isinstance(a, torch.Tensor):
        assert isinstance(b, torch.Tensor), f"{where}: tensor vs {type(b).__name__}"
        assert a.dtype == b.dtype and a.shape == b.shape, f"{where}: dtype or shape differs"
        assert torch.equal(a, b), f"{where}: values differ"
    elif isinstance(a, dict):
        assert isinstance(b, dict) and a.keys() == b.keys(), f"{where}: keys differ"
        for k in a:
            assert_same_state(a[k], b[k], f"{where}.{k}")
    elif isinstance(a, list | tuple):
        assert type(a) is type(b) and len(a) == len(b), f"{where}: sequence differs"
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            assert_same_state(x, y, f"{where}[{i}]")
    else:
        assert a == b, f"{where}: {a!r} != {b!r}"


def load_export(path: Path) -> dict[str, Any]:
    import torch

    state: dict[str, Any] = torch.load(path, weights_only=True)
    return state
