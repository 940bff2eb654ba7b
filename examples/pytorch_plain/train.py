"""A small, real PyTorch training run that survives preemption beside ckpt-sidecar.

    python examples/pytorch_plain/train.py --dir checkpoints --steps 300

* Every ``--save-every`` steps it writes ``step_<N>.pt`` (model, optimizer, RNG state, step)
  with ``atomic_save``: a temporary name, fsync, rename. The sidecar (default layout
  ``plain``) uploads each file once it is renamed into place.
* Every step it calls ``preemption_notice()`` (one ``stat`` while there is none). When the
  sidecar announces that the machine is being reclaimed (or SIGTERM arrives), it writes an
  emergency checkpoint of the step it is at, waits until the sidecar reports it committed
  (``wait_for_durable``), and exits 0.
* At start it resumes from the newest checkpoint in ``--dir`` (``latest_local_checkpoint``),
  e.g. one that ``ckpt-sidecar restore --to <dir>`` brought back on a new machine.

Deterministic (fixed seed, deterministic algorithms, one thread, the batch of step N drawn
from its own generator, the RNG state saved with the weights): interrupted and resumed any
number of times, it ends with the same weights, bit for bit, as a run that never stopped.
"""

from __future__ import annotations

import argparse
import signal
import sys
import threading
import time
from pathlib import Path
from typing import Any

import torch
from torch import nn

from sidecar.client import (
    atomic_save,
    default_admin_url,
    default_watch_dir,
    latest_local_checkpoint,
    preemption_notice,
    wait_for_durable,
)

FEATURES, CLASSES, BATCH = 32, 4, 64


def make_model() -> nn.Module:
    return nn.Sequential(
        nn.Linear(FEATURES, 128),
        nn.ReLU(),
        nn.Dropout(0.1),  # uses the global RNG: resuming exactly needs its state saved
        nn.Linear(128, 128),
        nn.ReLU(),
        nn.Linear(128, CLASSES),
    )


def batch(seed: int, step: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The batch of ``step``: the same on every run, whatever happened before."""
    teacher = torch.randn(FEATURES, CLASSES, generator=torch.Generator().manual_seed(seed))
    g = torch.Generator().manual_seed(seed * 100_003 + step)
    x = torch.randn(BATCH, FEATURES, generator=g)
    return x, (x @ teacher).argmax(dim=1)


def say(msg: str) -> None:
    print(msg, flush=True)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0] if __doc__ else None)
    p.add_argument(
        "--dir",
        "--checkpoint-dir",
        type=Path,
        default=default_watch_dir(),
        help="checkpoint folder",
    )
    p.add_argument("--steps", type=int, default=300, help="train until this step")
    p.add_argument("--save-every", type=int, default=50)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--log-every", type=int, default=50)
    p.add_argument("--step-seconds", type=float, default=0.0, help="pretend a step is slow")
    p.add_argument("--admin-url", default=default_admin_url(), help="the sidecar's admin URL")
    p.add_argument("--durable-timeout", type=float, default=60.0)
    p.add_argument("--export", type=Path, help="write the final model and optimizer here")
    args = p.parse_args(argv)

    # = torch.use_deterministic_algorithms(True), without importing the compiler (seconds of
    # start-up); use that one instead if you torch.compile.
    torch.set_deterministic_debug_mode("error")
    torch.set_num_threads(1)
    torch.manual_seed(args.seed)
    model = make_model()
    optim = torch.optim.Adam(model.parameters(), lr=1e-3)
    args.dir.mkdir(parents=True, exist_ok=True)

    step, last_saved = 0, -1
    newest = latest_local_checkpoint(args.dir)
    if newest is None:
        say(f"no checkpoint in {args.dir}: starting from scratch (seed {args.seed})")
    else:
        ckpt: dict[str, Any] = torch.load(newest, weights_only=True)
        model.load_state_dict(ckpt["model"])
        optim.load_state_dict(ckpt["optimizer"])
        torch.set_rng_state(ckpt["rng"])
        step = last_saved = int(ckpt["step"])
        say(f"resumed from {newest.name} at step {step}")

    def save(kind: str) -> str:
        name = f"step_{step:06d}.pt"
        state = {
            "step": step,
            "model": model.state_dict(),
            "optimizer": optim.state_dict(),
            "rng": torch.get_rng_state(),
        }
        atomic_save(state, args.dir / name)  # torch.save to a temporary name, fsync, rename
        say(f"saved {kind} checkpoint {name}")
        return name

    # SIGTERM (pod eviction, scancel, systemctl stop) is a notice too: Python's default
    # would end the process at once, before its emergency save.
    terminated = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: terminated.set())
    loss_fn = nn.CrossEntropyLoss()
    model.train()
    while step < args.steps:
        notice = preemption_notice(args.dir)
        if notice is not None or terminated.is_set():
            left = notice.seconds_left() if notice is not None else args.durable_timeout + 5
            said = f"notice from {notice.source} ({notice.kind})" if notice else "SIGTERM"
            say(f"preemption {said}: {left:.0f} s left, stopping at step {step}")
            name = save("emergency") if step != last_saved else f"step_{step:06d}.pt"
            wait = max(min(args.durable_timeout, left - 5), 1.0)
            if wait_for_durable(step, timeout=wait, admin_url=args.admin_url):
                say(f"{name} is durable; exiting so the job can resume elsewhere")
            else:
                say(f"{name} was not reported durable within {wait:.0f} s; exiting")
            return 0
        x, y = batch(args.seed, step + 1)
        optim.zero_grad()
        loss = loss_fn(model(x), y)
        loss.backward()
        optim.step()
        step += 1
        if args.step_seconds:
            time.sleep(args.step_seconds)
        if step % args.log_every == 0:
            say(f"step {step} loss {loss.item():.6f}")
        if step % args.save_every == 0 or step == args.steps:
            save("regular")
            last_saved = step

    say(f"finished {args.steps} steps")
    if args.export:
        atomic_save({"model": model.state_dict(), "optimizer": optim.state_dict()}, args.export)
    return 0


if __name__ == "__main__":
    sys.exit(main())
