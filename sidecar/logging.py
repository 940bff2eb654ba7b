"""structlog setup: one JSON object per line on stdout, or a console renderer on a TTY."""

from __future__ import annotations

import logging
import sys
from typing import Any

import structlog

__all__ = ["configure"]

_LEVELS = {
    "debug": logging.DEBUG,
    "info": logging.INFO,
    "warning": logging.WARNING,
    "error": logging.ERROR,
}


def configure(level: str = "info", fmt: str = "auto", stream: Any = None) -> None:
    """Configure structlog globally; ``fmt``: ``json``, ``console``, ``auto`` (TTY: console)."""
    out = stream or sys.stdout
    use_console = fmt == "console" or (fmt == "auto" and out.isatty())
    renderer: Any = (
        structlog.dev.ConsoleRenderer(colors=False)
        if use_console
        else structlog.processors.JSONRenderer()
    )
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            structlog.processors.format_exc_info,
            renderer,
        ],
        wrapper_class=structlog.make_filtering_bound_logger(_LEVELS[level]),
        logger_factory=structlog.PrintLoggerFactory(out),
        cache_logger_on_first_use=False,
    )
