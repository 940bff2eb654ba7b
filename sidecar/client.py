"""The training script's side of ckpt-sidecar: one import, standard library only.

* :func:`atomic_save` writes a checkpoint so the sidecar never sees half of it.
* :func:`preemption_notice` tells whether the machine is being reclaimed; cheap enough to
  call every step (one ``stat`` while there is no notice).
* :func:`wait_for_durable` blocks, for a bounded time, until the sidecar reports a step
  committed.
* :func:`latest_local_checkpoint` finds what to resume from after ``ckpt-sidecar restore``.

Importing this module imports nothing outside the standard library. PyTorch is imported only
when :func:`atomic_save` is handed an object to ``torch.save``; the layout rules are imported
from the daemon's own modules (standard library only) when :func:`latest_local_checkpoint`
runs, so trainer and sidecar agree on what a checkpoint and its step are.
"""

from __future__ import annotations

import glob
import json
import os
import secrets
import shutil
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import IO, Any

from sidecar.atomic_write import fsync_folder, fsync_path  # standard library only, as this module

__all__ = [
    "NOTICE_FILE",
    "Notice",
    "atomic_save",
    "daemon_status",
    "default_admin_url",
    "default_watch_dir",
    "latest_local_checkpoint",
    "preemption_notice",
    "wait_for_durable",
]

NOTICE_FILE = ".ckpt-sidecar-notice.json"
"""The file the daemon writes into its watched folder on a notice (``sidecar.drain`` uses
this name, so both sides agree by construction)."""

Writer = Callable[[IO[bytes]], object]
PathWriter = Callable[[str], object]


# -- atomic_save ----------------------------------------------------------------------------
def atomic_save(
    obj_or_writer: object,
    path: str | os.PathLike[str],
    *,
    writer_takes_path: bool = False,
) -> Path:
    """Write one checkpoint file so that ``path`` holds either the old or the whole new file.

    * ``obj_or_writer`` not callable: it is written with ``torch.save(obj, file)`` (PyTorch
      is imported now; :class:`ImportError` if it is missing).
    * callable: ``writer(file)`` is called with a binary file object open for writing
      (``torch.save``, ``pickle.dump``, ``numpy.save`` all take one), e.g.
      ``atomic_save(lambda f: pickle.dump(state, f), path)``. A ``torch.nn.Module`` is
      callable but is saved, not called (better: save its ``state_dict()``).
    * callable with ``writer_takes_path=True``: ``writer(tmp_path)`` gets the temporary path
      as a ``str`` and must write one file exactly there (``safetensors.torch.save_file``).
      A writer that adds its own extension, or makes a folder, gets
      :class:`FileNotFoundError` and what it wrote is removed.

    The bytes go to a temporary name in the same folder (``.<name>.<random>.tmp``: hidden and
    ``*.tmp``, which the sidecar never uploads), are flushed and fsynced, renamed over
    ``path`` and the folder is fsynced. The file gets the usual ``0o666 & ~umask`` mode, so
    a sidecar in the same group can read it. On any error the temporary file is removed,
    ``path`` is left as it was, and the error propagates. Returns ``path`` as a ``Path``.
    """
    target = Path(path)
    tmp = target.with_name(f".{target.name}.{secrets.token_hex(4)}.tmp")
    is_writer = callable(obj_or_writer) and not _is_torch_module(obj_or_writer)
    try:
        if is_writer and writer_takes_path:
            assert callable(obj_or_writer)
            obj_or_writer(str(tmp))
            _fsync_file(tmp)
        else:
            write = obj_or_writer if is_writer else _torch_writer(obj_or_writer)
            assert callable(write)
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
            with os.fdopen(fd, "wb") as f:
                write(f)
                closed_by_writer = f.closed  # some writers close the file they are given
                if not closed_by_writer:
                    f.flush()
                    os.fsync(f.fileno())
            if closed_by_writer:
                _fsync_file(tmp)
        os.replace(tmp, target)
    except BaseException:
        _remove_temporaries(tmp)
        raise
    fsync_folder(target.parent)
    return target


def _remove_temporaries(tmp: Path) -> None:
    """The temporary file, and whatever a path writer made from its name (``.npz`` added,
    a folder); the random part of the name makes anything else impossible."""
    for p in tmp.parent.glob(glob.escape(tmp.name) + "*"):
        if p.is_dir() and not p.is_symlink():
            shutil.rmtree(p, ignore_errors=True)
        else:
            p.unlink(missing_ok=True)


def _is_torch_module(obj: object) -> bool:
    """A ``torch.nn.Module`` is callable but is an object to save, never a writer."""
    torch = sys.modules.get("torch")
    nn = getattr(torch, "nn", None)
    return nn is not None and isinstance(obj, nn.Module)


def _torch_writer(obj: object) -> Writer:
    try:
        import torch
    except ImportError as e:
        raise ImportError(
            "atomic_save(obj, path) saves with torch.save; install torch, or pass a writer "
            "function that takes a binary file object"
        ) from e
    return lambda f: torch.save(obj, f)


def _fsync_file(path: Path) -> None:
    if not path.is_file():
        raise FileNotFoundError(
            f"the writer left no file at {path}; with writer_takes_path=True it must write "
            "exactly to the path it is given (no added extension, no folder)"
        )
    fsync_path(path)


# -- defaults shared with the daemon --------------------------------------------------------
def default_watch_dir(env: Mapping[str, str] | None = None) -> Path:
    """``CKPT_SIDECAR_WATCH__PATH`` (the daemon's own variable), else ``./checkpoints``."""
    e = os.environ if env is None else env
    return Path(e.get("CKPT_SIDECAR_WATCH__PATH") or "checkpoints")


def default_admin_url(env: Mapping[str, str] | None = None) -> str:
    """``http://<admin.host>:<admin.port>`` from ``CKPT_SIDECAR_ADMIN__HOST``/``__PORT``
    (the daemon's own variables), else ``http://127.0.0.1:9477`` (the daemon's default)."""
    e = os.environ if env is None else env
    host = e.get("CKPT_SIDECAR_ADMIN__HOST") or "127.0.0.1"
    if host in ("0.0.0.0", "::"):
        host = "127.0.0.1"
    if ":" in host:
        host = f"[{host}]"
    return f"http://{host}:{e.get('CKPT_SIDECAR_ADMIN__PORT') or '9477'}"


# -- the notice -----------------------------------------------------------------------------
@dataclass(frozen=True)
class Notice:
    """What the trainer learns of a termination notice: the daemon's notice file, parsed.

    ``source`` is ``aws|gcp|azure|signal|http|file``; ``kind`` e.g. ``terminate``,
    ``preempt``; ``deadline`` is when the machine goes away (aware, UTC). An unreadable
    notice file still counts: source and kind ``unknown``, deadline = its mtime (act now).
    """

    source: str
    kind: str
    deadline: datetime
    received_at: datetime

    def seconds_left(self, now: datetime | None = None) -> float:
        """Seconds until the deadline (negative once it passed)."""
        return (self.deadline - (now or datetime.now(UTC))).total_seconds()


_FileKey = tuple[int, int, int]
_file_cache: dict[Path, tuple[_FileKey, Notice]] = {}
#: per admin URL: (monotonic time of the last answer or give-up, reached?, the notice seen)
_status_cache: dict[str, tuple[float, bool, Notice | None]] = {}
#: when this process started using the client: a notice whose deadline passed before then is
#: a previous run's (a VM stopped and started again with its disk), not this one's
_STARTED = time.time()
#: seconds one status request may take; a sidecar that does not answer is asked again only
#: after :data:`UNREACHABLE_BACKOFF_SECONDS`, so a hung one costs a training loop little
STATUS_TIMEOUT_SECONDS = 0.5
UNREACHABLE_BACKOFF_SECONDS = 5.0


def preemption_notice(
    watch_dir: str | os.PathLike[str] | None = None,
    *,
    admin_url: str | None = None,
    status_interval: float = 1.0,
) -> Notice | None:
    """The current termination notice, or ``None``. Cheap: call it every step.

    Reads ``<watch_dir>/.ckpt-sidecar-notice.json`` (``watch_dir`` defaults to
    :func:`default_watch_dir`). While the file is absent this costs one ``stat``; once it
    exists it is parsed once per (mtime, size, inode) and the parsed notice is reused.
    With ``admin_url``, and no notice file, the daemon's ``/v1/status`` is also asked, at
    most every ``status_interval`` seconds (for a trainer that cannot see the sidecar's
    folder; a request waits at most :data:`STATUS_TIMEOUT_SECONDS`, and a daemon that did not
    answer is asked again only after :data:`UNREACHABLE_BACKOFF_SECONDS`). A daemon that
    cannot be reached is not a notice, nor is one received, with its deadline passed, before
    this process started (a previous run's). Never raises for a missing or unreadable file or an
    unreachable daemon.

    The daemon leaves the notice file in place (the machine is going away); restore into a
    fresh folder, or delete the file, before training in the same folder again.
    """
    path = Path(watch_dir if watch_dir is not None else default_watch_dir()) / NOTICE_FILE
    try:
        st = os.stat(path)
    except OSError:
        return _current(_from_status(admin_url, status_interval)) if admin_url else None
    key = (st.st_mtime_ns, st.st_size, st.st_ino)
    cached = _file_cache.get(path)
    if cached is not None and cached[0] == key:
        return _current(cached[1])
    notice = _read_notice_file(path, st.st_mtime)
    _file_cache[path] = (key, notice)
    return _current(notice)


def _current(notice: Notice | None) -> Notice | None:
    """``notice`` unless it was received and its deadline passed before this process started
    (an earlier run's). A notice received since counts, whatever its deadline."""
    if notice is not None and max(notice.deadline, notice.received_at).timestamp() < _STARTED:
        return None
    return notice


def _read_notice_file(path: Path, mtime: float) -> Notice:
    try:
        with open(path, "rb") as f:
            doc = json.loads(f.read(64 * 1024))
        notice = _notice_from(doc)
    except (OSError, ValueError):
        notice = None
    if notice is None:
        when = datetime.fromtimestamp(mtime, UTC)
        notice = Notice("unknown", "unknown", when, when)
    return notice


def _notice_from(doc: object) -> Notice | None:
    """A :class:`Notice` from the daemon's JSON object; ``None`` if it is not one."""
    if not isinstance(doc, dict):
        return None
    try:
        deadline = _parse_time(doc["deadline"])
        received = _parse_time(doc.get("received_at") or doc["deadline"])
        return Notice(str(doc["source"]), str(doc["kind"]), deadline, received)
    except (KeyError, TypeError, ValueError):
        return None


def _parse_time(text: object) -> datetime:
    if not isinstance(text, str):
        raise TypeError("not a string")
    when = datetime.fromisoformat(text)
    return when.replace(tzinfo=UTC) if when.tzinfo is None else when.astimezone(UTC)


def _from_status(admin_url: str, interval: float) -> Notice | None:
    cached = _status_cache.get(admin_url)
    if cached is not None:
        answered, reached, notice = cached
        wait = interval if reached else max(interval, UNREACHABLE_BACKOFF_SECONDS)
        if time.monotonic() - answered < wait:
            return notice
    status = daemon_status(admin_url, timeout=STATUS_TIMEOUT_SECONDS)
    notice = _notice_from(status.get("notice")) if status else None
    # timed from the answer, not the ask: a slow answer must not make the next ask immediate
    _status_cache[admin_url] = (time.monotonic(), status is not None, notice)
    return notice


# -- the daemon's status ----------------------------------------------------------------------
#: the most of a reply from the admin port that is read (a status names every file in flight)
MAX_ADMIN_REPLY_BYTES = 16 * 1024 * 1024


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, *args: Any, **kwargs: Any) -> None:
        return None  # a 3xx is an HTTPError: the token is never sent on to another address


def open_admin(request: urllib.request.Request | str, timeout: float) -> bytes:
    """One request to the daemon's admin port: the reply's body (at most
    ``MAX_ADMIN_REPLY_BYTES``). Never through ``http_proxy`` / ``https_proxy`` (the admin
    port is this machine's or the pod's; a proxy would get the token and never reach it)
    and never redirected. Raises ``OSError`` (``urllib.error.URLError``, ``HTTPError``)."""
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}), _NoRedirect())
    try:
        with opener.open(request, timeout=timeout) as resp:
            body: bytes = resp.read(MAX_ADMIN_REPLY_BYTES)
            return body
    except urllib.error.HTTPError as e:
        e.close()  # its connection: callers only need the code
        raise


def daemon_status(admin_url: str | None = None, timeout: float = 2.0) -> dict[str, Any] | None:
    """``GET <admin_url>/v1/status`` as a dict, or ``None`` when the daemon cannot be reached
    or does not answer JSON within ``timeout`` seconds. ``admin_url`` defaults to
    :func:`default_admin_url`."""
    base = (admin_url or default_admin_url()).rstrip("/")
    if not base.startswith(("http://", "https://")):
        raise ValueError(f"admin_url must be an http(s) URL, not {base!r}")
    try:
        doc = json.loads(open_admin(base + "/v1/status", timeout))
    except (OSError, ValueError):  # URLError, timeouts and refused connections are OSError
        return None
    return doc if isinstance(doc, dict) else None


def wait_for_durable(
    step: int,
    timeout: float = 60.0,
    admin_url: str | None = None,
    *,
    poll_interval: float = 0.25,
) -> bool:
    """Poll ``/v1/status`` until ``last_committed.step >= step``; ``True`` when it is.

    Returns ``False`` once ``timeout`` seconds passed without that (the daemon unreachable
    counts as not yet). Never blocks much longer than ``timeout``. The step is compared as
    the daemon orders checkpoints: a destination that already holds a higher step from an
    earlier run answers ``True`` at once, so give each run its own destination.
    """
    end = time.monotonic() + timeout
    while True:
        left = end - time.monotonic()
        status = daemon_status(admin_url, timeout=max(min(left, 2.0), 0.05))
        last = status.get("last_committed") if status else None
        got = last.get("step") if isinstance(last, dict) else None
        if isinstance(got, int) and got >= step:
            return True
        left = end - time.monotonic()
        if left <= 0:
            return False
        time.sleep(min(poll_interval, left))


# -- resuming ---------------------------------------------------------------------------------
def latest_local_checkpoint(
    directory: str | os.PathLike[str],
    layout: str = "plain",
    *,
    pattern: list[str] | None = None,
    step_regex: str | None = None,
    marker: str | None = None,
) -> Path | None:
    """The newest complete checkpoint entry in ``directory``, or ``None`` (also when the
    folder does not exist: a fresh start).

    Uses the daemon's own rules (``checkpoint.layout``, ``checkpoint.pattern``,
    ``checkpoint.step_regex``, ``checkpoint.marker``): which names are checkpoints, when one
    is complete (e.g. ``torch-dcp``: the folder holds ``.metadata``), and its step (the
    regex capture, else the last integer in the name). Newest = largest step, then latest
    mtime; names without a step come before any with one. Hidden and temporary names,
    restore's work folders and ``<name>.replaced-<time>`` entries are never returned.
    :class:`KeyError` for an unknown layout.
    """
    from sidecar.watch.layouts import is_temporary, layout_for, step_of
    from sidecar.watch.scan import scan_entry

    rules = layout_for(layout, pattern, marker)
    root = Path(directory)
    best: tuple[tuple[int, int], Path] | None = None
    try:
        entries = list(os.scandir(root))
    except (FileNotFoundError, NotADirectoryError):
        return None
    for de in entries:
        name = de.name
        if name.startswith(".") or is_temporary(name) or ".replaced-" in name:
            continue
        if de.is_symlink():
            continue
        is_dir = de.is_dir(follow_symlinks=False)
        if not rules.matches(name, is_dir):
            continue
        try:
            snap = scan_entry(Path(de.path))
        except PermissionError:  # a root-owned lost+found: skipped, as the daemon does
            continue
        if not snap or not rules.complete(name, is_dir, snap, root):
            continue
        step = step_of(name, step_regex)
        rank = (-1 if step is None else step, max(s.mtime_ns for s in snap.values()))
        if best is None or rank > best[0]:
            best = (rank, Path(de.path))
    return None if best is None else best[1]
