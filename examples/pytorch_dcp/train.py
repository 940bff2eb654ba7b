"""The plain example with PyTorch Distributed Checkpoint (DCP), one process on gloo.

    CKPT_SIDECAR_CHECKPOINT__LAYOUT=torch-dcp ckpt-sidecar run --watch checkpoints &
    python examples/pytorch_dcp/train.py --dir checkpoints --steps 300

* Every ``--save-every`` steps ``dcp.save`` writes the folder ``step_<N>/`` (one
  ``__<rank>_<n>.distcp`` file per rank, then ``.metadata`` last, through a temporary name).
  Run the sidecar with ``checkpoint.layout: torch-dcp``: a folder counts as complete when it
  holds ``.metadata``, so a save cut short is never uploaded nor resumed from.
* Every step it calls ``preemption_notice()``; on a notice it writes an emergency checkpoint,
  waits until the sidecar reports it committed, and exits 0.
* At start it resumes from the newest complete ``step_<N>/`` in ``--dir``
  (``latest_local_checkpoint(dir, layout="torch-dcp")``), e.g. after ``ckpt-sidecar restore``.

With more ranks, call the same functions on every rank (DCP saves collectively) into one
folder all ranks share (rank 0 alone writes ``.metadata``: on node-local disks the other
nodes' folders never complete), with one sidecar uploading it; and reduce the notice across
ranks (``all_reduce`` with ``MAX``) so that every rank stops at the same step.
Deterministic: interrupted and resumed, it ends bit for bit where an uninterrupted run does.
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
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch import nn
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

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

    # One process; torchrun would give rank and world size (and a TCP store) instead.
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        return train(args)
    finally:
        dist.destroy_process_group()


def train(args: argparse.Namespace) -> int:
    # = torch.use_deterministic_algorithms(True), without importing the compiler (seconds of
    # start-up); use that one instead if you torch.compile.
    torch.set_deterministic_debug_mode("error")
    torch.set_num_threads(1)
    torch.manual_seed(args.seed)
    model = make_model()
    optim = torch.optim.Adam(model.parameters(), lr=1e-3)
    args.dir.mkdir(parents=True, exist_ok=True)

    step, last_saved = 0, -1
    newest = latest_local_checkpoint(args.dir, layout="torch-dcp")
    if newest is None:
        say(f"no checkpoint in {args.dir}: starting from scratch (seed {args.seed})")
    else:
        model_sd, optim_sd = get_state_dict(model, optim)
        state: dict[str, Any] = {
            "model": model_sd,
            "optim": optim_sd,
            "rng": torch.get_rng_state(),
            "step": 0,
        }
        dcp.load(state, checkpoint_id=newest)  # fills the tensors in place
        set_state_dict(
            model, optim, model_state_dict=state["model"], optim_state_dict=state["optim"]
        )
        torch.set_rng_state(state["rng"])
        step = last_saved = int(state["step"])
        say(f"resumed from {newest.name} at step {step}")

    def save(kind: str) -> str:
        name = f"step_{step:06d}"
        model_sd, optim_sd = get_state_dict(model, optim)
        state = {"model": model_sd, "optim": optim_sd, "rng": torch.get_rng_state(), "step": step}
        dcp.save(state, checkpoint_id=args.dir / name)  # .metadata is written last
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
            name = save("emergency") if step != last_saved else f"step_{step:06d}"
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
