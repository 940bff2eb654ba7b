"""``ckpt-sidecar``: run, restore, list, verify, config, drain. Parses, builds, prints.

Exit codes (every subcommand): 0 success; 1 error; 2 bad usage or config; 3 nothing to
restore (0 with --allow-empty); 4 a drain ended with the newest checkpoint not durable.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import urllib.error
import urllib.request
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import yaml

from sidecar import __version__
from sidecar.client import open_admin
from sidecar.config import Config
from sidecar.config_load import ConfigError, load, redacted
from sidecar.logging import configure
from sidecar.shown import shown
from sidecar.storage.base import Backend, DestinationRejected, StorageError
from sidecar.storage.registry import open_backend
from sidecar.storage.url import DestinationUrlError

__all__ = ["main"]

EXIT_OK, EXIT_ERROR, EXIT_USAGE, EXIT_NOTHING, EXIT_NOT_DURABLE = 0, 1, 2, 3, 4


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> Any:  # exit 2 with the reason, like argparse, but ours
        self.print_usage(sys.stderr)
        print(f"ckpt-sidecar: error: {message}", file=sys.stderr)
        raise SystemExit(EXIT_USAGE)


def _common(p: argparse.ArgumentParser, watch: bool = False) -> None:
    p.add_argument("--config", type=Path, help="YAML config file (see config.example.yaml)")
    p.add_argument("--destination", help="destination URL, e.g. s3://bucket/run-1")
    if watch:
        p.add_argument("--watch", type=Path, help="checkpoint folder to watch")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="ckpt-sidecar", description=__doc__.split("\n")[0] if __doc__ else "")
    parser.add_argument("--version", action="version", version=f"ckpt-sidecar {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)
    run = sub.add_parser("run", help="watch, upload, commit; drain on a notice")
    _common(run, watch=True)
    rs = sub.add_parser("restore", help="bring back the newest checkpoint that verifies")
    _common(rs)
    rs.add_argument("--to", type=Path, required=True, help="target folder")
    rs.add_argument("--checkpoint", help="restore this checkpoint name instead of the newest")
    rs.add_argument("--allow-empty", action="store_true", help="exit 0 when nothing to restore")
    rs.add_argument("--force", action="store_true", help="move an existing entry aside")
    rs.add_argument(
        "--deep",
        action="store_true",
        help="accepted and implied: restore reads every byte and checks its CRC32C "
        "against the manifest",
    )
    ls = sub.add_parser("list", help="list committed checkpoints")
    _common(ls)
    ls.add_argument("--json", action="store_true", help="machine-readable output")
    vf = sub.add_parser("verify", help="check every object of committed checkpoints")
    _common(vf)
    vf.add_argument("name", nargs="?", help="checkpoint name")
    vf.add_argument("--all", action="store_true", help="verify every committed checkpoint")
    vf.add_argument("--deep", action="store_true", help="read every byte back")
    cf = sub.add_parser("config", help="print the effective config, secrets redacted")
    _common(cf, watch=True)
    cf.add_argument("--check", action="store_true", help="only validate; exit 0 or 2")
    dr = sub.add_parser("drain", help="ask the running daemon to flush now (POST /v1/drain)")
    _common(dr)
    dr.add_argument("--url", help="admin URL (default http://<admin.host>:<admin.port>)")
    return parser


def _load(args: argparse.Namespace) -> Config:
    overrides = {"destination.url": args.destination}
    if getattr(args, "watch", None) is not None:
        overrides["watch.path"] = str(args.watch)
    return load(args.config, os.environ, overrides)


def _backend(cfg: Config) -> Backend:
    return open_backend(cfg.destination)


def _err(msg: str) -> None:
    print(f"ckpt-sidecar: {msg}", file=sys.stderr)


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        cfg = _load(args)
    except ConfigError as e:
        _err(str(e))
        return EXIT_USAGE
    configure(cfg.log.level, cfg.log.format, stream=sys.stderr if args.command != "run" else None)
    try:
        return int(_dispatch(args, cfg))
    except DestinationRejected as e:
        _err(str(e))
        return EXIT_USAGE
    except DestinationUrlError as e:
        _err(str(e))
        return EXIT_USAGE
    except (StorageError, OSError) as e:
        _err(f"{type(e).__name__}: {e}")
        return EXIT_ERROR


def _dispatch(args: argparse.Namespace, cfg: Config) -> int:
    cmd = args.command
    if cmd == "config":
        if not args.check:
            print(yaml.safe_dump(redacted(cfg), sort_keys=False), end="")
        return EXIT_OK
    if cmd == "run":
        from sidecar.runner import run_daemon

        return run_daemon(cfg)
    if cmd == "drain":
        return _drain(args, cfg)
    backend = _backend(cfg)
    try:
        if cmd == "restore":
            from sidecar.restore_cli import restore_command

            return restore_command(args, cfg, backend)
        if cmd == "list":
            return _list(args, backend)
        return _verify(args, backend)
    finally:
        backend.close()


def _list(args: argparse.Namespace, backend: Backend) -> int:
    from sidecar.catalog import Catalog

    def invalid(key: str, reason: str) -> None:
        _err(shown(f"not listed: manifest {key} cannot be read as a manifest ({reason})"))

    items = Catalog.load(backend, on_invalid=invalid).all()
    rows = [
        {
            "name": m.name,
            "generation": m.generation,
            "step": m.step,
            "sequence": m.sequence,
            "files": len(m.files),
            "bytes": m.size,
            "committed_at": m.committed_at,
        }
        for m in items
    ]
    if args.json:
        print(json.dumps(rows, indent=1))
        return EXIT_OK
    from rich.console import Console
    from rich.markup import escape
    from rich.table import Table

    table = Table(title=f"committed checkpoints in {backend.url}")
    for col in ("name", "generation", "step", "sequence", "files", "bytes", "committed_at"):
        table.add_column(col)
    for r in rows:
        table.add_row(*("" if v is None else escape(shown(str(v))) for v in r.values()))
    Console().print(table)
    return EXIT_OK


def _verify(args: argparse.Namespace, backend: Backend) -> int:
    from sidecar.catalog import Catalog
    from sidecar.checks import VerifyFailed, verify_manifest

    if not args.all and not args.name:
        _err("verify needs a checkpoint NAME or --all")
        return EXIT_USAGE
    unreadable: list[tuple[str, str]] = []
    items = Catalog.load(backend, on_invalid=lambda k, why: unreadable.append((k, why))).all()
    if args.name:
        items = [m for m in items if m.name == args.name]
        if not items:
            _err(f"no committed checkpoint named {args.name!r}")
            return EXIT_ERROR
    bad = 0
    if args.all:  # a manifest that does not parse is a checkpoint that cannot be restored
        for key, why in unreadable:
            bad += 1
            print(shown(f"FAILED  manifest {key}: cannot be read as a manifest ({why})"))
    with tempfile.TemporaryDirectory(prefix="ckpt-sidecar-verify-") as tmp:
        for m in items:
            try:
                verify_manifest(backend, m, deep=args.deep, tmp_dir=Path(tmp))
                print(shown(f"ok      {m.name} (generation {m.generation}, {len(m.files)} files)"))
            except VerifyFailed as e:
                bad += 1
                print(shown(f"FAILED  {m.name} (generation {m.generation}): {e}"))
    return EXIT_ERROR if bad else EXIT_OK


def _drain(args: argparse.Namespace, cfg: Config) -> int:
    host = cfg.admin.host if cfg.admin.host not in ("0.0.0.0", "::") else "127.0.0.1"
    url = (args.url or f"http://{host}:{cfg.admin.port}").rstrip("/") + "/v1/drain"
    headers = {}
    if cfg.admin.token is not None:
        headers["Authorization"] = f"Bearer {cfg.admin.token.get_secret_value()}"
    if not url.startswith(("http://", "https://")):
        _err(f"--url must be an http(s) URL, not {url!r}")
        return EXIT_USAGE
    req = urllib.request.Request(url, data=b"", method="POST", headers=headers)  # noqa: S310
    try:
        body = json.loads(open_admin(req, cfg.shutdown_grace_seconds + 30) or b"{}")
    except (urllib.error.URLError, OSError, ValueError) as e:
        _err(f"cannot reach the daemon at {url}: {e}; is `ckpt-sidecar run` running?")
        return EXIT_ERROR
    print(json.dumps(body))
    outcome = (body.get("drain") or {}).get("outcome")
    return EXIT_OK if outcome == "committed" else EXIT_NOT_DURABLE
