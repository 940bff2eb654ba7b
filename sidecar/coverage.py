"""Whether an outranked checkpoint is covered by newer commits.

A checkpoint that ``retention.keep_last`` committed ones outrank is not uploaded (retention
would delete it at once). It counts as durable only when the newer commits cover it: it is
an old local copy (:func:`written_after` is false), or it was saved together with a higher
committed checkpoint that is in the same watch folder (:func:`saved_with_newer_here`).
Anything else (a new run in an old destination) is not durable, and the daemon says so.
"""

from __future__ import annotations

import os
from pathlib import Path

from sidecar.manifest import Manifest
from sidecar.model import CheckpointReady

__all__ = ["SAME_SAVE_SECONDS", "saved_with_newer_here", "written_after"]


def written_after(item: CheckpointReady, manifest: Manifest) -> bool:
    """True when a file of ``item`` was modified after ``manifest`` was committed (or the
    commit time cannot be read: then nothing is assumed covered)."""
    committed = manifest.committed_ts()
    if committed is None:
        return True
    return item.written_ns / 1e9 > committed


#: a newer committed checkpoint here covers an outranked one written up to this long after
#: it (the same save: Lightning writes ``last.ckpt`` right after ``epoch=..-step=N.ckpt``)
SAME_SAVE_SECONDS = 300


def saved_with_newer_here(item: CheckpointReady, manifests: list[Manifest]) -> bool:
    """True when a committed checkpoint that orders above ``item`` is also in ``item``'s
    watch folder and changed no more than ``SAME_SAVE_SECONDS`` before ``item`` did: the
    trainer saved both together (Lightning's ``last.ckpt`` beside its committed
    ``epoch=...-step=N.ckpt``), so ``item`` holds nothing newer. Old files of an earlier run
    left in the folder, or a best-of-k kept from long ago, do not cover it; nor do the newer
    commits of an old destination, which are not here at all."""
    if not item.files:
        return False
    f = item.files[0]
    entry = f.path.parents[len(Path(f.rel).parts) - 1] if item.is_dir else f.path
    mine = item.order()[0]
    written = item.written_ns
    for m in manifests:
        if m.order()[0] <= mine:
            continue
        try:
            there = os.lstat(entry.parent / m.name)
        except OSError:
            continue
        if there.st_mtime_ns >= written - SAME_SAVE_SECONDS * 1_000_000_000:
            return True
    return False
