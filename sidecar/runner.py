"""``ckpt-sidecar run``: checks that need the machine (watch path, admin port), then the
daemon, whose start-up checks the destination. Anything wrong before start exits 2 with the
cause and the fix; so does a destination outside ``allowed_regions``."""

from __future__ import annotations

import sys

import structlog

from sidecar.admin import AdminServer
from sidecar.app import Daemon
from sidecar.config import Config
from sidecar.preemption.sources import build_sources
from sidecar.storage.registry import open_backend

__all__ = ["StartupError", "run_daemon"]

log = structlog.get_logger("sidecar.runner")


class StartupError(Exception):
    """A problem found before start; exit 2."""


def check_paths(cfg: Config) -> None:
    watch = cfg.watch.path.absolute()
    if not watch.exists():
        raise StartupError(f"watch.path {watch} does not exist; create it or fix --watch")
    if not watch.is_dir():
        raise StartupError(f"watch.path {watch} is a file, not a folder")
    url = cfg.destination.url
    if url.startswith("file://"):
        from sidecar.storage.url import parse_destination

        dest = parse_destination(url).path
        assert dest is not None
        dest = dest.absolute().resolve()
        w = watch.resolve()
        if dest == w or w in dest.parents:
            raise StartupError(
                f"destination {dest} is inside watch.path {w}: uploads would be watched "
                "and uploaded again; put the destination outside the watched folder"
            )
        if dest in w.parents:
            raise StartupError(
                f"watch.path {w} is inside the destination {dest}; use separate folders"
            )


def run_daemon(cfg: Config) -> int:
    try:
        check_paths(cfg)
    except StartupError as e:
        print(f"ckpt-sidecar: {e}", file=sys.stderr)
        return 2
    try:
        sources = build_sources(cfg.preemption, trigger_deadline_seconds=cfg.shutdown_grace_seconds)
    except ValueError as e:
        print(f"ckpt-sidecar: preemption: {e}", file=sys.stderr)
        return 2
    backend = open_backend(cfg.destination)
    daemon = Daemon(cfg, backend, sources=sources)
    daemon.install_signal_handlers()
    admin = None
    if cfg.admin.enabled:
        token = cfg.admin.token.get_secret_value() if cfg.admin.token else None
        try:
            admin = AdminServer(daemon, cfg.admin.host, cfg.admin.port, token)
        except OSError as e:
            print(
                f"ckpt-sidecar: admin.port {cfg.admin.port} on {cfg.admin.host} cannot be "
                f"bound ({e.strerror}); choose another admin.port or stop what uses it",
                file=sys.stderr,
            )
            return 2
        admin.start()
        log.info("admin.listening", host=cfg.admin.host, port=admin.port)
    try:
        return daemon.run()
    finally:
        if admin is not None:
            admin.stop()
