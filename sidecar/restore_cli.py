"""``ckpt-sidecar restore``: exit codes and progress around :func:`sidecar.restore.restore`."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable

from sidecar.config import Config
from sidecar.manifest import Manifest
from sidecar.restore import NoneVerifies, NothingToRestore, TargetExists, restore
from sidecar.shown import shown
from sidecar.state import StateCache
from sidecar.storage.base import Backend

__all__ = ["restore_command"]


def restore_command(args: argparse.Namespace, cfg: Config, backend: Backend) -> int:
    target = args.to.absolute()
    # The daemon's cache when state.dir is set (a systemd StateDirectory), so the daemon that
    # starts next matches the restored files without reading them again.
    cache = StateCache(cfg.state.dir or target / ".ckpt-sidecar-state")
    progress: Callable[[int], None] | None = None
    on_start: Callable[[Manifest], None] | None = None
    bar = None
    if sys.stderr.isatty():
        from rich.markup import escape
        from rich.progress import (
            BarColumn,
            DownloadColumn,
            Progress,
            TransferSpeedColumn,
        )

        bar = Progress(
            "[progress.description]{task.description}",
            BarColumn(),
            DownloadColumn(),
            TransferSpeedColumn(),
            transient=True,
        )
        task = bar.add_task("restore", total=None)

        def start(m: Manifest) -> None:
            bar.reset(task, total=m.size, description=escape(shown(m.name)))

        def advance(n: int) -> None:
            bar.advance(task, n)

        progress, on_start = advance, start
        bar.start()
    try:
        result = restore(
            backend,
            target,
            name=args.checkpoint,
            force=args.force,
            concurrency=max(4, cfg.upload.concurrency),
            cache=cache,
            progress=progress,
            on_start=on_start,
        )
    except NothingToRestore as e:
        print(shown(f"ckpt-sidecar: {e}"), file=sys.stderr)
        return 0 if args.allow_empty else 3
    except (NoneVerifies, TargetExists) as e:
        print(shown(f"ckpt-sidecar: {e}"), file=sys.stderr)
        return 1
    finally:
        if bar is not None:
            bar.stop()
    for name, reason in result.skipped:
        print(shown(f"ckpt-sidecar: skipped {name}: {reason}"), file=sys.stderr)
    m = result.manifest
    print(
        shown(
            f"restored {m.name} (step {m.step}, {len(m.files)} files, {m.size} bytes) "
            f"to {result.path}"
        )
    )
    return 0
